// The Python stacks of a process, for a hang verdict
// (HeartbeatResponse.stacks_request): of one `gradsync launch` started,
// answered on its behalf by the agent, or of this process (a
// gradsync.elastic loop, whose runtime answers for itself).
//
// A Python program that runs gradsync.torch.monitor() registers Python's
// faulthandler, when GRADSYNC_STACKS_FILE is set, to write every thread's
// Python stack to that file (appending) on GRADSYNC_STACKS_SIGNAL, after a
// first line "gradsync-stacks pid=PID". The agent gives each process a file
// of its own, empty at the start, in its private directory. To capture, it
// checks the registration (a process that did not register would die of
// the signal), signals PID, and reads what the dump appended once it stops
// growing. Without a registration it lists the process's threads with their
// kernel wait channels (/proc/PID/task/TID/wchan) and says why there are no
// Python frames. A gradsync.elastic loop registers the same way in a file
// of its own, on PythonStacksSignal(), since its process also runs the
// runtime's own stack capture on ThreadStackSignal().
//
// Stateless; thread-safe.
#ifndef GRADSYNC_WORKER_LAUNCH_PROCESS_STACKS_H_
#define GRADSYNC_WORKER_LAUNCH_PROCESS_STACKS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "worker/runtime/thread_stacks.h"

namespace gradsync {

// The stacks of process `pid` (its Python threads when it registered in
// `stacks_file`, else its threads' kernel wait channels), as
// ThreadStacks.request `request`, the dump asked for with `signal`. Waits
// at most `timeout` for the dump.
v1::ThreadStacks CaptureProcessStacks(
    int64_t request, pid_t pid, const std::string& stacks_file,
    absl::Duration timeout = absl::Seconds(2), int signal = ThreadStackSignal());

// The signal a Python process that runs gradsync's runtime itself (a
// gradsync.elastic loop) registers faulthandler on: SIGRTMIN+6.
int PythonStacksSignal();

// The threads of a faulthandler dump (all_threads=True), innermost frame
// first: frames as "function (file.py:12)" (the file's base name), at most
// 48 per thread, each thread named "python" (a dump does not name them).
std::vector<v1::ThreadStack> ParseFaulthandlerDump(absl::string_view dump);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_PROCESS_STACKS_H_
