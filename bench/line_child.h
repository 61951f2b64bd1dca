// LineChild: a child process driven one line at a time over pipes to its
// stdin and from its stdout (its stderr is the parent's). Benchmarks use it
// to run a part of themselves in a process of its own, where it shares no
// threads (gRPC's pollers above all) with the load the parent makes.
//
// Not thread-safe: one thread drives it. The process is killed and reaped
// on destruction if it is still running; every wait is bounded.
#ifndef GRADSYNC_BENCH_LINE_CHILD_H_
#define GRADSYNC_BENCH_LINE_CHILD_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradsync {

class LineChild {
 public:
  // Starts `argv` (argv[0] a path). Fails when it cannot be started.
  static absl::StatusOr<std::unique_ptr<LineChild>> Start(
      const std::vector<std::string>& argv);
  ~LineChild();
  LineChild(const LineChild&) = delete;
  LineChild& operator=(const LineChild&) = delete;

  // Writes `command` and a newline (nothing when empty), then reads the
  // next line the child prints, without its newline. DEADLINE_EXCEEDED
  // after `bound`; UNAVAILABLE when the child closed its stdout (exited).
  absl::StatusOr<std::string> Ask(const std::string& command,
                                  absl::Duration bound);

  // Closes the child's stdin (its cue to end) and waits up to `bound` for
  // it to exit, then kills it. OK when it exited with 0.
  absl::Status Close(absl::Duration bound);

 private:
  LineChild(pid_t pid, int to, int from) : pid_(pid), to_(to), from_(from) {}
  // Kills (if still running) and reaps the child.
  void Kill();

  pid_t pid_;
  int to_;    // the child's stdin, -1 once closed
  int from_;  // the child's stdout
  std::string buffered_;  // read past the last line returned
};

}  // namespace gradsync

#endif  // GRADSYNC_BENCH_LINE_CHILD_H_
