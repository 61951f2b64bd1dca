// The torch process group "gradsync" (worker/torch/process_group.h): ranks
// are threads of this process, bootstrapped through one in-memory store,
// over the shared-memory backend and over Gloo, for 1-3 ranks. Each
// collective's result is what torch's own would give; the futures DDP
// chains on complete with the outputs; bad tensors and reductions are
// refused with a message; an abort fails a collective a peer never joins,
// and once the group ended it no longer reaches the backend.
#include "worker/torch/process_group.h"

#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scripted_backend.h"
#include "tests/worker/backend/backend_test_util.h"
#include "worker/backend/store.h"

namespace gradsync {
namespace {

using ::gradsync::testing::OnEveryRank;
using ::testing::HasSubstr;

// (world size, shared memory)
class TorchProcessGroupTest
    : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }

  // One group per rank, made concurrently; none when any failed (the
  // failure is reported).
  std::vector<c10::intrusive_ptr<TorchProcessGroup>> Groups() {
    std::vector<c10::intrusive_ptr<TorchProcessGroup>> groups(world());
    TorchGroupOptions options;
    options.timeout = absl::Seconds(20);
    options.shared_memory = std::get<1>(GetParam());
    OnEveryRank(world(), [&](int rank) {
      absl::StatusOr<c10::intrusive_ptr<TorchProcessGroup>> made =
          CreateTorchProcessGroup(&store_, rank, world(), options);
      ASSERT_TRUE(made.ok()) << "rank " << rank << ": " << made.status();
      groups[rank] = *made;
    });
    for (const auto& group : groups) {
      if (!group) return {};  // the failure is reported above
    }
    return groups;
  }

  InMemoryStore store_;
};

TEST_P(TorchProcessGroupTest, TheTransportIsSharedMemoryOnOneHostUnlessTurnedOff) {
  auto groups = Groups();
  ASSERT_FALSE(groups.empty());
  EXPECT_EQ(groups[0]->transport(), std::get<1>(GetParam()) ? "shm" : "gloo");
  EXPECT_EQ(groups[0]->getBackendName(), "gradsync");
  EXPECT_EQ(groups.back()->getRank(), world() - 1);
  EXPECT_EQ(groups.back()->getSize(), world());
}

TEST_P(TorchProcessGroupTest, AllreduceSumsAndAverages) {
  auto groups = Groups();
  ASSERT_FALSE(groups.empty());
  OnEveryRank(world(), [&](int rank) {
    std::vector<at::Tensor> sum = {torch::full({1000}, rank + 1.0f)};
    groups[rank]->allreduce(sum)->wait();
    EXPECT_TRUE(sum[0].equal(torch::full({1000}, world() * (world() + 1) / 2.0f)));
    std::vector<at::Tensor> mean = {torch::full({7}, 2.0 * rank, torch::kDouble)};
    c10d::AllreduceOptions average;
    average.reduceOp = c10d::ReduceOp::AVG;
    groups[rank]->allreduce(mean, average)->wait();
    EXPECT_TRUE(mean[0].allclose(torch::full({7}, world() - 1.0, torch::kDouble)));
    std::vector<at::Tensor> counts = {torch::ones({3}, torch::kLong)};
    groups[rank]->allreduce(counts)->wait();
    EXPECT_EQ(counts[0][2].item<int64_t>(), world());
  });
}

TEST_P(TorchProcessGroupTest, BroadcastCopiesTheRootsTensor) {
  auto groups = Groups();
  ASSERT_FALSE(groups.empty());
  const int root = world() - 1;
  OnEveryRank(world(), [&](int rank) {
    std::vector<at::Tensor> tensors = {torch::full({5, 3}, rank * 1.0f)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    groups[rank]->broadcast(tensors, options)->wait();
    EXPECT_TRUE(tensors[0].equal(torch::full({5, 3}, root * 1.0f)));
  });
}

TEST_P(TorchProcessGroupTest, AllgatherFillsEveryRanksTensorInRankOrder) {
  auto groups = Groups();
  ASSERT_FALSE(groups.empty());
  OnEveryRank(world(), [&](int rank) {
    std::vector<at::Tensor> input = {torch::full({4}, rank * 1.0f)};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int r = 0; r < world(); ++r) output[0].push_back(torch::zeros({4}));
    groups[rank]->allgather(output, input)->wait();
    for (int r = 0; r < world(); ++r) {
      EXPECT_TRUE(output[0][r].equal(torch::full({4}, r * 1.0f))) << r;
    }
    at::Tensor flat = torch::zeros({world() * 2}, torch::kLong);
    at::Tensor mine = torch::full({2}, rank, torch::kLong);
    groups[rank]->_allgather_base(flat, mine)->wait();
    EXPECT_EQ(flat[2 * (world() - 1)].item<int64_t>(), world() - 1);
    groups[rank]->barrier()->wait();
  });
}

// DDP chains its gradient averaging on getFuture(): it must complete with
// the collective's outputs.
TEST_P(TorchProcessGroupTest, TheFutureCompletesWithTheOutputs) {
  auto groups = Groups();
  ASSERT_FALSE(groups.empty());
  OnEveryRank(world(), [&](int rank) {
    std::vector<at::Tensor> tensors = {torch::ones({16})};
    c10::intrusive_ptr<c10::ivalue::Future> future =
        groups[rank]->allreduce(tensors)->getFuture();
    future->wait();
    ASSERT_FALSE(future->hasError());
    std::vector<at::Tensor> value = future->value().toTensorVector();
    ASSERT_EQ(value.size(), 1u);
    EXPECT_EQ(value[0][0].item<float>(), world());
    EXPECT_EQ(value[0].data_ptr(), tensors[0].data_ptr());
  });
}

TEST_P(TorchProcessGroupTest, BadTensorsAndReductionsAreRefusedWithAMessage) {
  auto groups = Groups();
  ASSERT_FALSE(groups.empty());
  std::vector<at::Tensor> strided = {torch::ones({4, 4}).t()};
  try {
    groups[0]->allreduce(strided);
    ADD_FAILURE() << "a non-contiguous tensor was taken";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("contiguous"));
  }
  std::vector<at::Tensor> bools = {torch::ones({4}, torch::kBool)};
  try {
    groups[0]->allreduce(bools);
    ADD_FAILURE() << "a bool tensor was taken";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("Bool"));
  }
  std::vector<at::Tensor> tensors = {torch::ones({4})};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  try {
    groups[0]->allreduce(tensors, max);
    ADD_FAILURE() << "MAX was taken";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("SUM and AVG"));
  }
  // What the backend refuses fails the call, not a later wait.
  c10d::BroadcastOptions no_such_root;
  no_such_root.rootRank = world();
  try {
    groups[0]->broadcast(tensors, no_such_root);
    ADD_FAILURE() << "a root outside the group was taken";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("root"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, TorchProcessGroupTest,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param), "Ranks",
                          std::get<1>(info.param) ? "Shm" : "Gloo");
    });

// A peer that never joins the collective: the rank that aborts fails it at
// once, with the backend's error in the exception.
TEST(TorchProcessGroupAbortTest, AnAbortFailsACollectiveAPeerNeverJoins) {
  InMemoryStore store;
  std::vector<c10::intrusive_ptr<TorchProcessGroup>> groups(2);
  TorchGroupOptions options;
  options.timeout = absl::Seconds(60);
  OnEveryRank(2, [&](int rank) {
    absl::StatusOr<c10::intrusive_ptr<TorchProcessGroup>> made =
        CreateTorchProcessGroup(&store, rank, 2, options);
    ASSERT_TRUE(made.ok()) << made.status();
    groups[rank] = *made;
  });
  ASSERT_TRUE(groups[0] && groups[1]);
  std::vector<at::Tensor> tensors = {torch::ones({64})};
  c10::intrusive_ptr<c10d::Work> work = groups[0]->allreduce(tensors);
  groups[0]->Abort();
  const absl::Time start = absl::Now();
  try {
    work->wait();
    ADD_FAILURE() << "the collective completed";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("allreduce #1"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_TRUE(work->isCompleted());
  EXPECT_FALSE(work->isSuccess());
}

// A round's group over the runtime's backend (python/ext/job.cc): a thread
// that still holds the group after its round (gradsync.torch.abort) must
// not reach the backend, which the runtime destroys once the group ended.
TEST(TorchProcessGroupAbortTest, AnEndedGroupNoLongerReachesItsBackend) {
  auto backend = std::make_unique<testing::ScriptedBackend>();
  testing::ScriptedBackend* scripted = backend.get();
  auto group = c10::make_intrusive<TorchProcessGroup>(scripted);
  group->Abort();
  EXPECT_EQ(scripted->aborts, 1);
  group->End();
  group->Abort();
  EXPECT_EQ(scripted->aborts, 1);
  backend.reset();
  group->Abort();
  EXPECT_EQ(group->transport(), "scripted");
  EXPECT_THROW(
      {
        std::vector<at::Tensor> tensors = {torch::ones({4})};
        group->allreduce(tensors);
      },
      std::exception);
}

}  // namespace
}  // namespace gradsync
