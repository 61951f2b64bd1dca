// One process the node agent started: its pid, the read ends of its stdout
// and stderr pipes, and a way to stop it.
#ifndef GRADSYNC_WORKER_LAUNCH_LOCAL_PROCESS_H_
#define GRADSYNC_WORKER_LAUNCH_LOCAL_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

// The exit code a process's wait status stands for: its exit status, or
// 128 + the signal that killed it (as a shell reports it).
int ExitCodeOf(int wait_status);

// How a process with exit code `exit_code` (ExitCodeOf) ended, for people:
// "exited with code 3", or for 128 + a signal "exited with code 137
// (SIGKILL)".
std::string ExitText(int exit_code);

// A started process. It runs in a process group of its own (what it starts
// is stopped with it, and a terminal's Ctrl-C reaches only the agent, which
// then stops it), with no signal blocked, and gets SIGKILL if the agent
// dies. Thread-safe: Wait()
// blocks one thread; Signal() may be called from others meanwhile.
// Destroying it does not stop the process: the agent stops and waits for
// its processes first.
class LocalProcess {
 public:
  // Starts `argv` (argv[0] looked up in PATH) with environment `env`
  // ("NAME=VALUE"). NOT_FOUND when argv[0] cannot be executed (the error
  // names it), INTERNAL when the pipes or fork fail.
  static absl::StatusOr<std::unique_ptr<LocalProcess>> Start(
      const std::vector<std::string>& argv,
      const std::vector<std::string>& env);

  ~LocalProcess();
  LocalProcess(const LocalProcess&) = delete;
  LocalProcess& operator=(const LocalProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The read ends of the process's stdout and stderr; the caller takes
  // them (and closes them at end of file).
  int TakeStdout();
  int TakeStderr();

  // Blocks until the process exits; its exit code (ExitCodeOf). What is
  // left of its group then gets SIGKILL, unless Signal() was called (a
  // stop, whose SIGTERM the group's members may still be handling). Call
  // once.
  int Wait();
  // Sends `signal` to the process's group unless it was already reaped.
  void Signal(int signal);

 private:
  LocalProcess(pid_t pid, int out, int err) : pid_(pid), out_(out), err_(err) {}

  const pid_t pid_;
  int out_, err_;
  absl::Mutex mu_;
  bool reaped_ ABSL_GUARDED_BY(mu_) = false;
  // Signal() sent a signal to the group before it was reaped.
  bool signalled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_LOCAL_PROCESS_H_
