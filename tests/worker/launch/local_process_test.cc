#include "worker/launch/local_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/eventually.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Everything `fd` delivers until end of file.
std::string ReadAll(int fd) {
  std::string out;
  char buffer[256];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) {
    out.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

TEST(LocalProcessTest, RunsWithItsEnvironmentAndReportsTheExitCode) {
  auto process = LocalProcess::Start(
      {"/bin/sh", "-c", "echo \"out $GREETING\"; echo err >&2; exit 7"},
      {"GREETING=hello"});
  ASSERT_TRUE(process.ok()) << process.status();
  const int out = (*process)->TakeStdout();
  const int err = (*process)->TakeStderr();
  EXPECT_EQ(ReadAll(out), "out hello\n");
  EXPECT_EQ(ReadAll(err), "err\n");
  EXPECT_EQ((*process)->Wait(), 7);
}

TEST(LocalProcessTest, SignalStopsTheProcessGroup) {
  // The shell's child (sleep) is in the same group: both stop.
  auto process = LocalProcess::Start({"/bin/sh", "-c", "sleep 60; exit 0"}, {});
  ASSERT_TRUE(process.ok()) << process.status();
  (*process)->Signal(SIGTERM);
  EXPECT_EQ((*process)->Wait(), 128 + SIGTERM);
  const int out = (*process)->TakeStdout();
  EXPECT_EQ(ReadAll(out), "");  // end of file: nothing holds the pipe
  (*process)->Signal(SIGKILL);   // reaped: a no-op
}

// Whether process `pid` is gone: no longer there, or a zombie.
bool Gone(pid_t pid) {
  FILE* stat =
      std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (stat == nullptr) return true;
  char line[512] = {};
  const bool read = std::fgets(line, sizeof(line), stat) != nullptr;
  std::fclose(stat);
  const char* state = read ? std::strrchr(line, ')') : nullptr;
  return state == nullptr || state[1] == '\0' || state[2] == 'Z' ||
         state[2] == 'X';
}

TEST(LocalProcessTest, WhatTheProcessLeftInItsGroupDiesWithIt) {
  auto process = LocalProcess::Start(
      {"/bin/sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!; exit 3"},
      {"PATH=/usr/bin:/bin"});
  ASSERT_TRUE(process.ok()) << process.status();
  const std::string printed = ReadAll((*process)->TakeStdout());
  const pid_t left = static_cast<pid_t>(std::atoi(printed.c_str()));
  ASSERT_GT(left, 0) << printed;
  EXPECT_EQ((*process)->Wait(), 3);
  EXPECT_TRUE(Eventually([left] { return Gone(left); }))
      << "pid " << left << " outlived its group's leader";
  if (!Gone(left)) kill(left, SIGKILL);
}

TEST(LocalProcessTest, AStoppedGroupKeepsItsGraceAfterTheLeaderExits) {
  // A shell that dies at SIGTERM, its child ignoring SIGTERM (once it said
  // its pid, the trap is set): the child is left to the stop's own SIGKILL,
  // not killed with the leader.
  auto process = LocalProcess::Start(
      {"/bin/sh", "-c",
       "sh -c 'trap \"\" TERM; echo $$; exec sleep 60 >/dev/null 2>&1' & "
       "wait"},
      {"PATH=/usr/bin:/bin"});
  ASSERT_TRUE(process.ok()) << process.status();
  const int out = (*process)->TakeStdout();
  char line[32] = {};
  ASSERT_GT(read(out, line, sizeof(line) - 1), 0);
  close(out);
  const pid_t child = static_cast<pid_t>(std::atoi(line));
  ASSERT_GT(child, 0) << line;
  (*process)->Signal(SIGTERM);
  EXPECT_EQ((*process)->Wait(), 128 + SIGTERM);
  // Still there a while later (a SIGKILL with the leader would have ended
  // it within milliseconds).
  EXPECT_FALSE(Eventually([child] { return Gone(child); }, absl::Seconds(1)))
      << "killed with its leader";
  // As the stop's SIGKILL after its timeout (the group outlives its
  // leader, so its id is not reused meanwhile).
  kill(-(*process)->pid(), SIGKILL);
  EXPECT_TRUE(Eventually([child] { return Gone(child); }));
}

TEST(LocalProcessTest, ExitTextNamesTheSignal) {
  EXPECT_EQ(ExitText(0), "exited with code 0");
  EXPECT_EQ(ExitText(3), "exited with code 3");
  EXPECT_EQ(ExitText(128 + SIGKILL), "exited with code 137 (SIGKILL)");
  EXPECT_EQ(ExitText(128 + SIGTERM), "exited with code 143 (SIGTERM)");
  EXPECT_EQ(ExitText(255), "exited with code 255");
}

TEST(LocalProcessTest, AProgramThatCannotRunIsNotFound) {
  auto process = LocalProcess::Start({"/nonexistent/train"}, {});
  ASSERT_FALSE(process.ok());
  EXPECT_TRUE(absl::IsNotFound(process.status())) << process.status();
  EXPECT_THAT(std::string(process.status().message()),
              HasSubstr("cannot run '/nonexistent/train'"));
}

// Opens /dev/null until no descriptor is left; the descriptors opened.
std::vector<int> OpenAllFree() {
  std::vector<int> fds;
  for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) {
    fds.push_back(fd);
  }
  return fds;
}

// Runs in a child of the test (EXPECT_EXIT): leaves 2 * `pipes` + 1
// descriptors free, so that Start opens `pipes` of its three pipes and the
// next fails, and exits 0 when Start failed with INTERNAL and every one of
// them is free again; otherwise says what it found on stderr.
void StartWithRoomForPipes(int pipes) {
  alarm(60);  // bounds the child, should it ever block
  rlimit limit;
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 256);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    std::perror("setrlimit");
    _exit(2);
  }
  std::vector<int> held = OpenAllFree();
  const size_t room = 2 * pipes + 1;
  if (held.size() < room) {
    std::fprintf(stderr, "only %zu descriptors free\n", held.size());
    _exit(2);
  }
  for (size_t i = 0; i < room; ++i) {
    close(held.back());
    held.pop_back();
  }
  absl::StatusOr<std::unique_ptr<LocalProcess>> process =
      LocalProcess::Start({"/bin/true"}, {});
  if (!absl::IsInternal(process.status())) {
    std::fprintf(stderr, "Start: %s\n", process.status().ToString().c_str());
    _exit(3);
  }
  const size_t free_after = OpenAllFree().size();
  if (free_after != room) {
    std::fprintf(stderr,
                 "%zu descriptors free after the failed Start, %zu before\n",
                 free_after, room);
    _exit(4);
  }
  _exit(0);
}

// A pipe that cannot be opened (no descriptor left) fails Start and leaves
// the pipes opened before it closed: a self-managed agent retries restarts.
class LocalProcessPipeTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalProcessPipeTest, AFailedPipeLeavesNoDescriptorOpen) {
  EXPECT_EXIT(StartWithRoomForPipes(GetParam()), ::testing::ExitedWithCode(0),
              "");
}

INSTANTIATE_TEST_SUITE_P(SecondAndThirdPipe, LocalProcessPipeTest,
                         ::testing::Values(1, 2));

}  // namespace
}  // namespace gradsync
