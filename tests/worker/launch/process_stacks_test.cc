#include "worker/launch/process_stacks.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/runtime/thread_stacks.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::PumpUntil;
using ::gradsync::testing::TempPath;

constexpr absl::Duration kBound = absl::Seconds(30);

TEST(ParseFaulthandlerDumpTest, ThreadsInnermostFirstWithBaseNames) {
  const std::vector<v1::ThreadStack> threads = ParseFaulthandlerDump(
      "Thread 0x00007f0e3b7fe640 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap\n"
      "\n"
      "Current thread 0x00007f0e4a1c6740 (most recent call first):\n"
      "  File \"/work/train.py\", line 41 in <module>\n"
      "  <no Python frame>\n");
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_EQ(threads[0].name(), "python");
  ASSERT_EQ(threads[0].frames_size(), 2);
  EXPECT_EQ(threads[0].frames(0), "wait (threading.py:324)");
  EXPECT_EQ(threads[0].frames(1), "_bootstrap (threading.py:1002)");
  ASSERT_EQ(threads[1].frames_size(), 1);
  EXPECT_EQ(threads[1].frames(0), "<module> (train.py:41)");
  EXPECT_TRUE(ParseFaulthandlerDump("garbage\n  File \"x\n").empty());
}

// A Python process that registers as gradsync.torch.monitor() does and
// parks its main thread in parked_here(); it prints "ready" once it did.
constexpr char kRegisteredPython[] = R"py(
import faulthandler, os, sys, time
stacks = open(os.environ["GRADSYNC_STACKS_FILE"], "a")
faulthandler.register(int(os.environ["GRADSYNC_STACKS_SIGNAL"]), file=stacks,
                      all_threads=True, chain=False)
stacks.write(f"gradsync-stacks pid={os.getpid()}\n"); stacks.flush()
def parked_here():
    print("ready", flush=True)
    time.sleep(60)
parked_here()
)py";

// Starts kRegisteredPython in `child`, registered on `signal` into `file`,
// and waits until it is parked.
void StartRegistered(const std::string& file, int signal, Child* child) {
  ASSERT_TRUE(child->Start(
      {"/usr/bin/env", absl::StrCat("GRADSYNC_STACKS_FILE=", file),
       absl::StrCat("GRADSYNC_STACKS_SIGNAL=", signal), "/usr/bin/python3",
       "-c", kRegisteredPython},
      /*capture=*/true));
  ASSERT_TRUE(PumpUntil({child}, kBound, [&] {
    return absl::StrContains(child->out(), "ready") || !child->running();
  }));
}

TEST(CaptureProcessStacksTest, ARegisteredPythonProcessGivesItsFrames) {
  const std::string file = TempPath("stacks-0");
  std::ofstream(file).close();
  Child child;
  ASSERT_NO_FATAL_FAILURE(StartRegistered(file, ThreadStackSignal(), &child));
  const v1::ThreadStacks stacks = CaptureProcessStacks(5, child.pid(), file);
  EXPECT_EQ(stacks.request(), 5);
  EXPECT_EQ(stacks.error(), "");
  ASSERT_EQ(stacks.threads_size(), 1) << stacks.DebugString();
  // In the sleep (line 9), or still returning from the print before it.
  EXPECT_TRUE(absl::StartsWith(absl::StrJoin(stacks.threads(0).frames(), " < "),
                               "parked_here (<string>:"));
  ASSERT_EQ(stacks.threads(0).frames_size(), 2);
  EXPECT_EQ(stacks.threads(0).frames(1), "<module> (<string>:10)");
  EXPECT_TRUE(child.running()) << "the signal only dumps";
  // A second request reads only the new dump.
  EXPECT_EQ(CaptureProcessStacks(6, child.pid(), file).threads_size(), 1);
}

// A gradsync.elastic process registers on PythonStacksSignal() (its runtime
// captures native stacks on ThreadStackSignal()): the dump is asked for with
// the signal given, which a process not registered for would die of.
TEST(CaptureProcessStacksTest, TheDumpIsAskedForWithTheSignalGiven) {
  const std::string file = TempPath("stacks-python-signal");
  std::ofstream(file).close();
  Child child;
  ASSERT_NO_FATAL_FAILURE(StartRegistered(file, PythonStacksSignal(), &child));
  EXPECT_NE(PythonStacksSignal(), ThreadStackSignal());
  const v1::ThreadStacks stacks = CaptureProcessStacks(
      8, child.pid(), file, absl::Seconds(2), PythonStacksSignal());
  EXPECT_EQ(stacks.error(), "");
  ASSERT_EQ(stacks.threads_size(), 1) << stacks.DebugString();
  EXPECT_EQ(stacks.threads(0).frames(1), "<module> (<string>:10)");
  EXPECT_TRUE(child.running()) << "the signal only dumps";
}

TEST(CaptureProcessStacksTest, AnUnregisteredProcessIsNotSignalled) {
  const std::string file = TempPath("stacks-1");
  std::ofstream(file).close();  // empty: nobody registered
  Child child;
  ASSERT_TRUE(child.Start({"/bin/sleep", "60"}, /*capture=*/false));
  const v1::ThreadStacks stacks = CaptureProcessStacks(7, child.pid(), file);
  EXPECT_TRUE(absl::StrContains(stacks.error(), "no Python stacks"))
      << stacks.error();
  ASSERT_EQ(stacks.threads_size(), 1);
  EXPECT_EQ(stacks.threads(0).name(), "sleep");
  EXPECT_TRUE(absl::StartsWith(stacks.threads(0).frames(0), "[kernel] "));
  // Would have died of the signal (its default action ends a process).
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(child.Reap()) << "still running";
}

TEST(CaptureProcessStacksTest, ARegistrationOfAnotherProcessTreeIsIgnored) {
  const std::string file = TempPath("stacks-2");
  // This test process "registered": not a descendant of the child.
  std::ofstream(file) << "gradsync-stacks pid=" << getpid() << "\n";
  Child child;
  ASSERT_TRUE(child.Start({"/bin/sleep", "60"}, /*capture=*/false));
  const v1::ThreadStacks stacks = CaptureProcessStacks(8, child.pid(), file);
  EXPECT_TRUE(absl::StrContains(stacks.error(), "no Python stacks"));
  EXPECT_FALSE(child.Reap());
}

}  // namespace
}  // namespace gradsync
