// CaptureThreadStacks: the stacks of every thread of this process, for the
// coordinator's hang diagnosis (HeartbeatResponse.stacks_request).
//
// Each other thread is interrupted with a real-time signal
// (kThreadStackSignal, SIGRTMIN+5) whose handler unwinds its own stack with
// glibc's backtrace() into a shared buffer and posts a semaphore; the
// capturing thread waits for it (at most `per_thread`), then symbolizes the
// frames with absl::Symbolize. A thread that blocks the signal or is
// stopped does not answer in time: it is listed without frames and named in
// the result's error. Threads are interrupted one at a time; the signal's
// handler is installed with SA_RESTART, so most interrupted system calls
// resume, but a thread blocked in one that never restarts (poll, epoll_wait,
// nanosleep, sem_timedwait) sees EINTR, as under a profiler: code that does
// not retry on EINTR can notice. The capture runs only when the coordinator
// diagnosed a hang.
//
// Thread-safe: concurrent captures run one after the other. The handler is
// installed on the first capture and stays for the life of the process.
#ifndef GRADSYNC_WORKER_RUNTIME_THREAD_STACKS_H_
#define GRADSYNC_WORKER_RUNTIME_THREAD_STACKS_H_

#include <string>

#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

struct ThreadStacksOptions {
  // How long one thread may take to answer the signal.
  absl::Duration per_thread = absl::Milliseconds(200);
  // At most this many threads (ThreadStacks' limit) and frames per thread.
  int max_threads = 128;
  int max_frames = 48;
};

// The stacks of every thread of this process but the calling one (whose
// stack is this capture), innermost frame first, with `request` as
// ThreadStacks.request.
v1::ThreadStacks CaptureThreadStacks(
    int64_t request, const ThreadStacksOptions& options = ThreadStacksOptions());

// The signal CaptureThreadStacks interrupts threads with.
int ThreadStackSignal();

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_THREAD_STACKS_H_
