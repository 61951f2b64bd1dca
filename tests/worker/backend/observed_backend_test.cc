// ObservedBackend over a scripted backend whose collectives complete when
// the test says so.
#include "worker/backend/observed_backend.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

// Hands out Works numbered 1, 2, ... that the test finishes; INVALID_ARGUMENT
// (sequence 0) for buffers without data, as real backends refuse them.
class ScriptedBackend final : public Backend {
 public:
  ScriptedBackend() : Backend(BackendOptions()) {}
  std::string name() const override { return "scripted"; }
  std::shared_ptr<Work> AllReduce(Buffer buffer, ReduceOp) override {
    return Issue(buffer);
  }
  std::shared_ptr<Work> Broadcast(Buffer buffer, int) override {
    return Issue(buffer);
  }
  std::shared_ptr<Work> AllGather(Buffer input, Buffer) override {
    return Issue(input);
  }
  std::shared_ptr<Work> Barrier() override {
    works.push_back(std::make_shared<Work>(works.size() + 1));
    return works.back();
  }
  void Abort() override { ++aborts; }
  int aborts = 0;
  std::vector<std::shared_ptr<Work>> works;

 private:
  std::shared_ptr<Work> Issue(const Buffer& buffer) {
    if (buffer.data == nullptr && buffer.count > 0) {
      return Work::Done(0, absl::InvalidArgumentError("no data"));
    }
    works.push_back(std::make_shared<Work>(works.size() + 1));
    return works.back();
  }
};

TEST(ObservedBackendTest, RecordsFingerprintsInIssueOrder) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  float data[7] = {};
  double wide[3] = {};
  observed.AllReduce(Buffer{data, 7, DataType::kFloat32}, ReduceOp::kAverage);
  observed.Broadcast(Buffer{wide, 3, DataType::kFloat64}, 0);
  observed.Barrier();
  observed.AllReduce(Buffer{nullptr, 5, DataType::kFloat32}, ReduceOp::kSum);

  std::vector<CollectiveRecord> records = observed.TakeRecords();
  ASSERT_EQ(records.size(), 3u);  // the refused one is not recorded
  EXPECT_EQ(records[0].sequence, 1u);
  EXPECT_EQ(records[0].op, "allreduce");
  EXPECT_EQ(records[0].dtype, DataType::kFloat32);
  EXPECT_EQ(records[0].count, 7);
  EXPECT_EQ(records[1].op, "broadcast");
  EXPECT_EQ(records[1].dtype, DataType::kFloat64);
  EXPECT_EQ(records[2].op, "barrier");
  EXPECT_EQ(records[2].count, 0);
  EXPECT_TRUE(observed.TakeRecords().empty());
  EXPECT_EQ(observed.name(), "scripted");
}

TEST(ObservedBackendTest, LastFinishedWaitsForEveryEarlierCollective) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  EXPECT_EQ(observed.last_started(), 0u);
  EXPECT_EQ(observed.last_finished(), 0u);
  for (int i = 0; i < 3; ++i) observed.Barrier();
  EXPECT_EQ(observed.last_started(), 3u);
  inner.works[1]->Finish(absl::OkStatus());  // #2 before #1
  EXPECT_EQ(observed.last_finished(), 0u);
  inner.works[0]->Finish(absl::OkStatus());
  EXPECT_EQ(observed.last_finished(), 2u);
  inner.works[2]->Finish(absl::UnavailableError("peer died"));
  EXPECT_EQ(observed.last_finished(), 3u);  // ended, if badly
}

TEST(ObservedBackendTest, AbortReachesTheInnerBackend) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  observed.Abort();
  EXPECT_EQ(inner.aborts, 1);
}

TEST(ObservedBackendTest, KeepsOnlyTheNewestRecords) {
  ScriptedBackend inner;
  ObservedBackend observed(&inner);
  for (size_t i = 0; i < ObservedBackend::kMaxPending + 5; ++i) {
    observed.Barrier();
  }
  std::vector<CollectiveRecord> records = observed.TakeRecords();
  ASSERT_EQ(records.size(), ObservedBackend::kMaxPending);
  EXPECT_EQ(records.front().sequence, 6u);
}

}  // namespace
}  // namespace gradsync
