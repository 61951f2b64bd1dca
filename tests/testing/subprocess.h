// Child processes for tests that run gradsync's real binaries: spawning with
// captured output, bounded waiting, and a coordinator process on a loopback
// port. Not thread-safe: one test thread drives them.
#ifndef GRADSYNC_TESTS_TESTING_SUBPROCESS_H_
#define GRADSYNC_TESTS_TESTING_SUBPROCESS_H_

#include <poll.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace testing {

// The path of a data dependency of the running test ("server/x").
std::string Runfile(const std::string& path);

// A path under the test's private temporary directory, in a folder of this
// process's own (created on the first call).
std::string TempPath(const std::string& name);

// This machine's host name ("localhost" if unknown).
std::string Hostname();

// A child process, optionally with its stdout and stderr captured through
// pipes. Killed and reaped on destruction if it is still running.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();

  // Starts `argv`. With `capture`, stdout and stderr go to pipes read by
  // Pump(); otherwise they are the test's own (its log). Records a test
  // failure and returns false when the process cannot start.
  bool Start(const std::vector<std::string>& argv, bool capture);

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exited_; }
  bool pipes_open() const { return out_fd_ >= 0 || err_fd_ >= 0; }
  // The exit code, or -1 for a process killed by a signal.
  int exit_code() const;
  // Whether it was killed by `signal_number`.
  bool killed_by(int signal_number) const;
  // Command line, how it ended, and its captured output.
  std::string describe() const;
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

  // Reaps the process if it has exited; true once it has.
  bool Reap();

  // Adds the open pipes to `fds`.
  void AddPollFds(std::vector<pollfd>* fds) const;

  // Reads what is available on the pipes; closes them at EOF.
  void Pump(const std::vector<pollfd>& ready);

  // Signals the process (if still running).
  void Signal(int signal_number);

 private:
  static void CloseFd(int* fd);
  static void Drain(int* fd, std::string* into);

  std::string argv_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string out_;
  std::string err_;
};

// Collects the output of `children` and reaps them until all have exited and
// closed their pipes, or `bound` passes: then the stragglers are killed and
// the call returns false. poll() wakes on output; its timeout only paces the
// reaping of processes that have closed their pipes.
bool WaitAll(const std::vector<Child*>& children, absl::Duration bound);

// Collects output until `done()` holds (true) or `bound` passes (false),
// without waiting for the children to exit. `done` is checked after every
// read.
template <typename Done>
bool PumpUntil(const std::vector<Child*>& children, absl::Duration bound,
               Done done);

// Python for RunPython's scripts: imports torch and defines load(path),
// torch.load as PyTorch calls it by default from 2.6 (weights_only=True:
// containers, tensors and scalars, no other objects), so that the tests show
// what a user of such a PyTorch reads. torch 1.13's weights_only cannot read
// floats at all: there load is the plain torch.load.
inline constexpr char kPythonLoad[] =
    "import torch\n"
    "def load(path):\n"
    "    return torch.load(\n"
    "        path, weights_only=not torch.__version__.startswith('1.'))\n";

// Runs Debian's Python (/usr/bin/python3, with python3-torch) on `script`
// (written to a file under TempPath, named after `name`), waiting at most
// `bound`; stdout and stderr are captured. Success when it exits 0,
// otherwise a failure with its output.
::testing::AssertionResult RunPython(const std::string& name,
                                     const std::string& script,
                                     absl::Duration bound = absl::Minutes(3));

// gradsync-coordinator as a child process on a free loopback port.
class CoordinatorProcess {
 public:
  // Starts `binary` (extra flags appended) and waits for its port file.
  // `name` makes the port file unique within the test.
  ::testing::AssertionResult Start(const std::string& binary,
                                   const std::string& name,
                                   const std::vector<std::string>& flags = {});
  // SIGTERM, then the coordinator must exit 0 within `bound`.
  ::testing::AssertionResult Stop(absl::Duration bound = absl::Seconds(10));

  // "127.0.0.1:PORT" once started.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  Child& child() { return child_; }

 private:
  Child child_;
  int port_ = 0;
  std::string address_;
};

template <typename Done>
bool PumpUntil(const std::vector<Child*>& children, absl::Duration bound,
               Done done) {
  const absl::Time deadline = absl::Now() + bound;
  while (!done()) {
    std::vector<pollfd> fds;
    for (Child* c : children) {
      c->AddPollFds(&fds);
      c->Reap();
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int timeout_ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 20));
    if (poll(fds.data(), fds.size(), timeout_ms) > 0) {
      for (Child* c : children) c->Pump(fds);
    }
  }
  return true;
}

}  // namespace testing
}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_SUBPROCESS_H_
