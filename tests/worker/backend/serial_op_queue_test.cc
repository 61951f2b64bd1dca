// Tests of SerialOpQueue on its own: order, sequence numbers, messages,
// ABORTED after a failure, CANCELLED at shutdown.
#include "worker/backend/serial_op_queue.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(8);

TEST(SerialOpQueueTest, RunsInIssueOrderWithSequenceNumbers) {
  SerialOpQueue queue("test", 1, 3);
  std::vector<uint64_t> ran;  // only the queue's thread writes it
  std::vector<std::string> wheres;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 5; ++i) {
    works.push_back(queue.Enqueue(
        i == 2 ? "barrier" : "allreduce",
        i == 3 ? SerialOpQueue::RunFn()  // no elements: OK in its turn
               : [&](uint64_t sequence, const std::string& where) {
                   ran.push_back(sequence);
                   wheres.push_back(where);
                   return absl::OkStatus();
                 }));
  }
  for (size_t i = 0; i < works.size(); ++i) {
    EXPECT_EQ(works[i]->sequence(), i + 1);
  }
  EXPECT_TRUE(works.back()->Wait(kBound).ok());
  for (const auto& work : works) EXPECT_TRUE(work->IsCompleted());
  EXPECT_THAT(ran, ElementsAre(1, 2, 3, 5));
  EXPECT_EQ(wheres[0], "test allreduce #1 (rank 1 of 3)");
  EXPECT_EQ(wheres[2], "test barrier #3 (rank 1 of 3)");
}

TEST(SerialOpQueueTest, CollectivesAfterAFailureAreAbortedWithoutRunning) {
  SerialOpQueue queue("test", 0, 2);
  std::atomic<int> runs{0};
  auto fail =
      queue.Enqueue("allreduce", [&](uint64_t, const std::string& where) {
        ++runs;
        return absl::UnavailableError(where + ": peer died");
      });
  auto later = queue.Enqueue("barrier", [&](uint64_t, const std::string&) {
    ++runs;
    return absl::OkStatus();
  });
  auto empty = queue.Enqueue("broadcast", nullptr);
  EXPECT_EQ(fail->Wait(kBound).code(), absl::StatusCode::kUnavailable);
  for (const auto& work : {later, empty}) {
    absl::Status status = work->Wait(kBound);
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("not run: an earlier collective failed (UNAVAILABLE: "
                          "test allreduce #1 (rank 0 of 2): peer died); create "
                          "a new backend in a new round"));
  }
  EXPECT_EQ(runs.load(), 1);
}

TEST(SerialOpQueueTest, ShutdownCancelsQueuedThenInterruptsTheRunningOne) {
  SerialOpQueue queue("test", 0, 2);
  absl::Notification started;
  absl::Notification interrupted;
  auto running = queue.Enqueue("allreduce", [&](uint64_t, const std::string&) {
    started.Notify();
    interrupted.WaitForNotificationWithTimeout(kBound);
    return absl::CancelledError("interrupted");
  });
  auto queued = queue.Enqueue(
      "barrier", [](uint64_t, const std::string&) { return absl::OkStatus(); });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(kBound));
  bool queued_done_before_interrupt = false;
  queue.Shutdown([&] {
    queued_done_before_interrupt = queued->IsCompleted();
    interrupted.Notify();
  });
  EXPECT_TRUE(queued_done_before_interrupt);
  EXPECT_EQ(running->status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(queued->status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(queued->status().message()),
              HasSubstr("test barrier #2 (rank 0 of 2): cancelled: the backend "
                        "was destroyed before it ran"));
  // After shutdown: cancelled at once, still numbered.
  auto late = queue.Enqueue("barrier", nullptr);
  EXPECT_EQ(late->sequence(), 3u);
  EXPECT_EQ(late->status().code(), absl::StatusCode::kCancelled);
  queue.Shutdown();  // idempotent
}

}  // namespace
}  // namespace gradsync
