#include "worker/runtime/thread_stacks.h"

#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/error_text.h"

namespace gradsync {
namespace {

constexpr int kMaxFrames = 128;
constexpr size_t kMaxFrameChars = 200;
// Frames of the handler itself: the handler and the kernel's signal
// trampoline (__restore_rt); the interrupted code's frames follow.
constexpr int kSignalFrames = 2;
// How long a thread that took the signal may take to finish its unwind
// after the wait for it ran out (it is inside the handler by then).
constexpr absl::Duration kFinishGrace = absl::Seconds(1);

pid_t Tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// What the handler and the capturing thread share. One capture at a time
// (Capture::mu), so the handler only ever fills it for the thread named in
// `target`.
struct Shared {
  // The thread to unwind; the handler that finds its own id here takes the
  // job by setting it to 0, and the capturer takes it back the same way
  // when it stops waiting, so exactly one of them owns the buffer.
  std::atomic<pid_t> target{0};
  void* frames[kMaxFrames];
  std::atomic<int> depth{0};
  sem_t done;
};
Shared shared;

void OnStackSignal(int, siginfo_t*, void*) {
  const int saved_errno = errno;
  pid_t me = Tid();
  if (shared.target.compare_exchange_strong(me, 0)) {
    shared.depth.store(backtrace(shared.frames, kMaxFrames));
    sem_post(&shared.done);
  }
  errno = saved_errno;
}

// Installs the handler once; false (with `error`) when it cannot be.
bool Install(std::string* error) {
  static absl::once_flag once;
  static std::string failure;
  absl::call_once(once, [] {
    void* warm[1];
    backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
    if (sem_init(&shared.done, 0, 0) != 0) {
      failure = absl::StrCat("sem_init: ", strerror(errno));
      return;
    }
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = OnStackSignal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(ThreadStackSignal(), &action, nullptr) != 0) {
      failure = absl::StrCat("sigaction: ", strerror(errno));
    }
  });
  *error = failure;
  return failure.empty();
}

// Waits for the handler's post until `deadline`; false when it did not come.
bool WaitDone(absl::Time deadline) {
  const timespec until = absl::ToTimespec(deadline);
  while (sem_timedwait(&shared.done, &until) != 0) {
    if (errno != EINTR) return false;
  }
  return true;
}

// The thread ids of this process, from /proc/self/task.
std::vector<pid_t> ThreadIds() {
  std::vector<pid_t> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (const dirent* entry = readdir(dir)) {
    int tid = 0;
    if (absl::SimpleAtoi(entry->d_name, &tid)) tids.push_back(tid);
  }
  closedir(dir);
  return tids;
}

std::string ThreadName(pid_t tid) {
  std::ifstream in(absl::StrCat("/proc/self/task/", tid, "/comm"));
  std::string name;
  std::getline(in, name);
  return name;
}

// "gradsync::Reducer::Wait()", or "?? (libfoo.so.1+0x1f00)".
std::string FrameName(void* pc) {
  char name[1024];
  // A return address points past its call; the call is in the same
  // function but for a call at a function's very end, so look up pc - 1.
  void* lookup = static_cast<char*>(pc) - 1;
  if (absl::Symbolize(lookup, name, sizeof(name))) {
    std::string text(name);
    if (text.size() > kMaxFrameChars) text.resize(kMaxFrameChars);
    return text;
  }
  Dl_info info;
  if (dladdr(pc, &info) != 0 && info.dli_fname != nullptr) {
    const char* base = strrchr(info.dli_fname, '/');
    return absl::StrCat(
        "?? (", base != nullptr ? base + 1 : info.dli_fname, "+0x",
        absl::Hex(static_cast<char*>(pc) - static_cast<char*>(info.dli_fbase)),
        ")");
  }
  return absl::StrCat("?? (0x", absl::Hex(reinterpret_cast<uintptr_t>(pc)), ")");
}

// Unwinds `tid` through the handler; false when it did not answer in time.
bool Unwind(pid_t tid, absl::Duration timeout, std::vector<void*>* frames) {
  shared.target.store(tid);
  if (syscall(SYS_tgkill, getpid(), tid, ThreadStackSignal()) != 0) {
    shared.target.store(0);
    return false;  // it exited meanwhile
  }
  if (!WaitDone(absl::Now() + timeout)) {
    pid_t expected = tid;
    if (shared.target.compare_exchange_strong(expected, 0)) return false;
    // The handler took the job just now: let it finish.
    if (!WaitDone(absl::Now() + kFinishGrace)) return false;
  }
  const int depth = shared.depth.load();
  frames->assign(shared.frames, shared.frames + depth);
  return true;
}

}  // namespace

int ThreadStackSignal() { return SIGRTMIN + 5; }

v1::ThreadStacks CaptureThreadStacks(int64_t request,
                                     const ThreadStacksOptions& options) {
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  v1::ThreadStacks out;
  out.set_request(request);
  std::string error;
  if (!Install(&error)) {
    out.set_error(CutErrorText(absl::StrCat("cannot capture stacks: ", error)));
    return out;
  }
  const pid_t self = Tid();
  std::vector<pid_t> silent;
  int skipped = 0;
  for (pid_t tid : ThreadIds()) {
    if (tid == self) continue;
    if (out.threads_size() == options.max_threads) {
      ++skipped;
      continue;
    }
    std::vector<void*> frames;
    if (!Unwind(tid, options.per_thread, &frames)) {
      const std::string task = absl::StrCat("/proc/self/task/", tid);
      if (access(task.c_str(), F_OK) != 0) continue;  // it exited meanwhile
      silent.push_back(tid);
    }
    v1::ThreadStack* thread = out.add_threads();
    thread->set_tid(tid);
    thread->set_name(ThreadName(tid));
    for (size_t i = kSignalFrames;
         i < frames.size() && thread->frames_size() < options.max_frames; ++i) {
      thread->add_frames(FrameName(frames[i]));
    }
  }
  std::vector<std::string> errors;
  if (!silent.empty()) {
    errors.push_back(absl::StrCat(
        silent.size() == 1 ? "thread " : "threads ", absl::StrJoin(silent, ","),
        " did not answer within ", absl::FormatDuration(options.per_thread),
        " (signal blocked, or stopped)"));
  }
  if (skipped > 0) {
    errors.push_back(absl::StrCat(skipped, " more threads left out (at most ",
                                  options.max_threads, ")"));
  }
  out.set_error(CutErrorText(absl::StrJoin(errors, "; ")));
  return out;
}

}  // namespace gradsync
