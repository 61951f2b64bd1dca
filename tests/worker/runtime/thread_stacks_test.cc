#include "worker/runtime/thread_stacks.h"

#include <pthread.h>
#include <signal.h>

#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

// Parks the calling thread, named `name`, until `release`; the function's
// name is what the capture must find on its stack.
__attribute__((noinline)) void ParkedInNamedFunction(
    const char* name, absl::Notification* parked, absl::Notification* release) {
  pthread_setname_np(pthread_self(), name);
  parked->Notify();
  release->WaitForNotification();
  asm volatile("");  // keeps the frame from becoming a tail call
}

const v1::ThreadStack* FindThread(const v1::ThreadStacks& stacks,
                                  const std::string& name) {
  for (const v1::ThreadStack& t : stacks.threads()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

TEST(ThreadStacksTest, NamesTheFunctionEachThreadIsIn) {
  absl::Notification parked, release;
  std::thread thread(ParkedInNamedFunction, "gs-parked", &parked, &release);
  parked.WaitForNotification();

  const v1::ThreadStacks stacks = CaptureThreadStacks(7);
  release.Notify();
  thread.join();

  EXPECT_EQ(stacks.request(), 7);
  EXPECT_EQ(stacks.error(), "");
  const v1::ThreadStack* found = FindThread(stacks, "gs-parked");
  ASSERT_NE(found, nullptr) << stacks.DebugString();
  EXPECT_GT(found->tid(), 0);
  const std::string frames = absl::StrJoin(found->frames(), "\n");
  EXPECT_TRUE(absl::StrContains(frames, "ParkedInNamedFunction")) << frames;
  // The handler's own frames are not shown: the stack starts where the
  // thread was interrupted.
  EXPECT_FALSE(absl::StrContains(frames, "OnStackSignal")) << frames;
  // The capturing thread (this one) is left out.
  for (const v1::ThreadStack& t : stacks.threads()) {
    EXPECT_FALSE(absl::StrContains(absl::StrJoin(t.frames(), "\n"),
                                   "CaptureThreadStacks"))
        << t.name();
  }
}

TEST(ThreadStacksTest, AThreadThatBlocksTheSignalIsNamedNotWaitedFor) {
  absl::Notification parked, release;
  std::thread thread([&] {
    sigset_t blocked;
    sigemptyset(&blocked);
    sigaddset(&blocked, ThreadStackSignal());
    pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
    ParkedInNamedFunction("gs-deaf", &parked, &release);
  });
  parked.WaitForNotification();

  ThreadStacksOptions options;
  options.per_thread = absl::Milliseconds(50);
  const v1::ThreadStacks stacks = CaptureThreadStacks(8, options);
  // Unblocked only after the thread leaves; the pending signal is then
  // delivered to a handler that finds no job for it.
  release.Notify();
  thread.join();

  const v1::ThreadStack* deaf = FindThread(stacks, "gs-deaf");
  ASSERT_NE(deaf, nullptr) << stacks.DebugString();
  EXPECT_EQ(deaf->frames_size(), 0);
  EXPECT_TRUE(absl::StrContains(stacks.error(), std::to_string(deaf->tid())))
      << stacks.error();
  EXPECT_TRUE(absl::StrContains(stacks.error(), "did not answer within 50ms"))
      << stacks.error();

  // The next capture is not confused by the late signal.
  absl::Notification parked2, release2;
  std::thread next(ParkedInNamedFunction, "gs-next", &parked2, &release2);
  parked2.WaitForNotification();
  const v1::ThreadStacks again = CaptureThreadStacks(9);
  release2.Notify();
  next.join();
  const v1::ThreadStack* found = FindThread(again, "gs-next");
  ASSERT_NE(found, nullptr);
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(found->frames(), "\n"),
                                "ParkedInNamedFunction"));
}

TEST(ThreadStacksTest, KeepsToTheLimits) {
  absl::Notification parked, release;
  std::thread thread(ParkedInNamedFunction, "gs-limited", &parked, &release);
  parked.WaitForNotification();
  ThreadStacksOptions options;
  options.max_frames = 2;
  options.max_threads = 1;
  const v1::ThreadStacks stacks = CaptureThreadStacks(1, options);
  release.Notify();
  thread.join();
  ASSERT_EQ(stacks.threads_size(), 1);
  EXPECT_LE(stacks.threads(0).frames_size(), 2);
}

}  // namespace
}  // namespace gradsync
