// KvManager's write path against a storage whose commits the test holds and
// fails: concurrent writes share one commit, nothing is shown before it is
// durable, and a failed commit fails its writes and leaves no trace.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"
#include "server/job_manager.h"
#include "server/kv_manager.h"
#include "tests/testing/controlled_storage.h"
#include "tests/testing/eventually.h"

namespace gradsync {
namespace {

using ::gradsync::testing::ControlledStorage;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJob[] = "train";

class KvDurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::JobConfig config;
    config.set_job_id(kJob);
    ASSERT_TRUE(jobs_.Create(config).ok());
    kv_.OpenRound(kJob, 1);
  }

  // Whatever a failed assertion left held goes through.
  void TearDown() override {
    storage_.Open();
    if (first_thread_.joinable()) first_thread_.join();
  }

  // Starts a Set of key=value on its own thread; its outcome in *status.
  std::thread SetInBackground(const std::string& key, absl::Status* status) {
    return std::thread([this, key, status] { *status = kv_.Set(scope_, key, "v"); });
  }

  // Holds commits and starts a Set of "first" that waits at the door; its
  // outcome in first_.
  void HoldAFirstWrite() {
    storage_.Close();
    const int before = storage_.entered();
    first_thread_ = SetInBackground("first", &first_);
    ASSERT_TRUE(Eventually([&] { return storage_.entered() > before; }));
  }

  ControlledStorage storage_;
  FakeClock clock_;
  JobManager jobs_{&storage_, &clock_};
  KvManager kv_{&storage_, &clock_, &jobs_};
  const KvScope scope_{kJob, 1};
  absl::Status first_;
  std::thread first_thread_;
};

TEST_F(KvDurabilityTest, WritesQueuedDuringACommitShareTheNextOne) {
  ASSERT_NO_FATAL_FAILURE(HoldAFirstWrite());
  constexpr int kWriters = 5;
  std::vector<absl::Status> statuses(kWriters);
  std::vector<std::thread> writers;
  for (int i = 0; i < kWriters; ++i) {
    writers.push_back(SetInBackground(absl::StrCat("k", i), &statuses[i]));
  }
  ASSERT_TRUE(Eventually([&] { return kv_.QueuedWrites() == kWriters; }));
  storage_.Open();
  first_thread_.join();
  for (std::thread& t : writers) t.join();
  EXPECT_TRUE(first_.ok()) << first_;
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
  // The open-round reset and the first write, then every queued write in
  // one commit.
  const std::vector<size_t> batches = storage_.batches();
  ASSERT_GE(batches.size(), 2u);
  EXPECT_EQ(batches.back(), static_cast<size_t>(kWriters));
  EXPECT_EQ(kv_.QueuedWrites(), 0);
}

// The asynchronous calls (the gRPC handlers'): issued from one thread
// while a commit runs, they queue without waiting and share the next
// commit; each answers once its write is durable.
TEST_F(KvDurabilityTest, AsyncAddsCompareAndSetsAndDeletesShareACommit) {
  ASSERT_TRUE(kv_.Set(scope_, "gone", "v").ok());
  ASSERT_NO_FATAL_FAILURE(HoldAFirstWrite());
  absl::Mutex mu;
  std::vector<std::string> answers;
  const auto note = [&](std::string answer) {
    absl::MutexLock lock(&mu);
    answers.push_back(std::move(answer));
  };
  for (int i = 0; i < 3; ++i) {
    kv_.AddAsync(scope_, "counter", 1, absl::StrCat("id-", i),
                 [&](absl::StatusOr<int64_t> v) {
                   note(v.ok() ? absl::StrCat("add ", *v) : v.status().ToString());
                 });
  }
  kv_.CompareAndSetAsync(scope_, "cas", "", /*expect_absent=*/true, "x", "",
                         [&](absl::StatusOr<CasResult> r) {
                           note(r.ok() ? absl::StrCat("cas ", r->swapped)
                                       : r.status().ToString());
                         });
  kv_.DeleteAsync(scope_, "gone", [&](absl::StatusOr<bool> existed) {
    note(existed.ok() ? absl::StrCat("delete ", *existed)
                      : existed.status().ToString());
  });
  {
    absl::MutexLock lock(&mu);
    EXPECT_THAT(answers, ::testing::IsEmpty()) << "answered before durable";
  }
  EXPECT_EQ(kv_.QueuedWrites(), 5);
  storage_.Open();
  first_thread_.join();
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return answers.size() == 5;
  }));
  {
    absl::MutexLock lock(&mu);
    EXPECT_THAT(answers, ElementsAre("add 1", "add 2", "add 3", "cas 1",
                                     "delete 1"));
  }
  EXPECT_EQ(storage_.batches().back(), 5u + 3u)  // the writes and 3 ids
      << "one commit for all five";
  EXPECT_EQ(*kv_.Get(scope_, "counter"), "3");
}

TEST_F(KvDurabilityTest, NothingIsShownBeforeItIsDurable) {
  ASSERT_NO_FATAL_FAILURE(HoldAFirstWrite());
  absl::Notification got, waited;
  absl::StatusOr<std::string> value;
  absl::Status wait_status;
  std::thread reader([&] {
    value = kv_.Get(scope_, "first");
    got.Notify();
  });
  kv_.Wait(scope_, {"first"}, absl::Seconds(30), [&](absl::Status s) {
    wait_status = s;
    waited.Notify();
  });
  // Neither the Get nor the Wait may answer while the write is held.
  EXPECT_FALSE(got.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  EXPECT_FALSE(waited.HasBeenNotified());
  storage_.Open();
  reader.join();
  first_thread_.join();
  ASSERT_TRUE(waited.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
  EXPECT_TRUE(wait_status.ok()) << wait_status;
}

TEST_F(KvDurabilityTest, FailedCommitFailsItsWritesAndThoseQueuedBehind) {
  ASSERT_NO_FATAL_FAILURE(HoldAFirstWrite());
  absl::Status second;
  std::thread writer = SetInBackground("second", &second);
  ASSERT_TRUE(Eventually([&] { return kv_.QueuedWrites() == 1; }));
  storage_.FailNext();
  storage_.Open();
  first_thread_.join();
  writer.join();
  for (const absl::Status& s : {first_, second}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr("could not store the write: disk full"));
  }
  // Memory matches storage again: neither key exists, and writing works.
  EXPECT_EQ(kv_.Get(scope_, "first").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(kv_.Get(scope_, "second").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(kv_.Set(scope_, "third", "3").ok());
  absl::StatusOr<std::vector<Storage::Entry>> listed =
      kv_.List(scope_, "", /*keys_only=*/false);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(*listed, ElementsAre(std::make_pair("third", "3")));
}

TEST_F(KvDurabilityTest, AFailedAddLeavesTheCounterAsItWas) {
  ASSERT_TRUE(kv_.Add(scope_, "n", 5).ok());
  storage_.FailNext();
  EXPECT_EQ(kv_.Add(scope_, "n", 1).status().code(),
            absl::StatusCode::kUnavailable);
  absl::StatusOr<int64_t> next = kv_.Add(scope_, "n", 1);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 6);
}

TEST_F(KvDurabilityTest, AFailedAddsRequestIdIsDroppedWithItAndItsRetryAdds) {
  ASSERT_TRUE(kv_.Add(scope_, "n", 5).ok());
  storage_.FailNext();
  EXPECT_EQ(kv_.Add(scope_, "n", 1, "r1").status().code(),
            absl::StatusCode::kUnavailable);
  absl::StatusOr<int64_t> retry = kv_.Add(scope_, "n", 1, "r1");
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(*retry, 6);
  EXPECT_EQ(kv_.Add(scope_, "n", 1, "r1").value(), 6);
}

TEST_F(KvDurabilityTest, ARetryWhileTheFirstIsCommittingWaitsForItsOutcome) {
  ASSERT_NO_FATAL_FAILURE(HoldAFirstWrite());
  absl::StatusOr<int64_t> first = absl::UnknownError("not run");
  absl::StatusOr<int64_t> retry = absl::UnknownError("not run");
  // The first Add queues behind the held write; its retry arrives before
  // either is durable and must not be answered before them.
  std::thread adder([&] { first = kv_.Add(scope_, "n", 1, "r1"); });
  ASSERT_TRUE(Eventually([&] { return kv_.QueuedWrites() == 1; }));
  std::thread retrier([&] { retry = kv_.Add(scope_, "n", 1, "r1"); });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(retry.status().code(), absl::StatusCode::kUnknown);
  storage_.Open();
  first_thread_.join();
  adder.join();
  retrier.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(*first, 1);
  EXPECT_EQ(*retry, 1);
  EXPECT_EQ(kv_.Get(scope_, "n").value(), "1");
}

}  // namespace
}  // namespace gradsync
