#include "worker/launch/local_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// Exit code of a child whose exec failed (it reports errno on a pipe).
constexpr int kExecFailed = 127;

std::vector<char*> Pointers(const std::vector<std::string>& words) {
  std::vector<char*> out;
  out.reserve(words.size() + 1);
  for (const std::string& w : words) out.push_back(const_cast<char*>(w.c_str()));
  out.push_back(nullptr);
  return out;
}

void CloseIfOpen(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// A close-on-exec pipe; the ends it still holds are closed when it goes out
// of scope, so that no return of Start leaks one.
class Pipe {
 public:
  Pipe() = default;
  ~Pipe() {
    CloseIfOpen(&fds_[0]);
    CloseIfOpen(&fds_[1]);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;

  // Opens the pipe; false (errno set) when it cannot.
  bool Open() { return pipe2(fds_, O_CLOEXEC) == 0; }
  int read_end() const { return fds_[0]; }
  int write_end() const { return fds_[1]; }
  void CloseWriteEnd() { CloseIfOpen(&fds_[1]); }
  // The read end, which the caller now owns.
  int TakeReadEnd() {
    const int fd = fds_[0];
    fds_[0] = -1;
    return fd;
  }

 private:
  int fds_[2] = {-1, -1};
};

}  // namespace

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string ExitText(int exit_code) {
  std::string text = absl::StrCat("exited with code ", exit_code);
  const int signal = exit_code - 128;
  const char* name = signal > 0 && signal < NSIG ? sigabbrev_np(signal) : nullptr;
  if (name != nullptr) absl::StrAppend(&text, " (SIG", name, ")");
  return text;
}

absl::StatusOr<std::unique_ptr<LocalProcess>> LocalProcess::Start(
    const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to start");
  Pipe out, err, exec_error;
  if (!out.Open() || !err.Open() || !exec_error.Open()) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // Everything the child needs is built before fork: after it, a child of
  // a multithreaded process may only make async-signal-safe calls.
  std::vector<char*> args = Pointers(argv);
  std::vector<char*> envp = Pointers(env);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;  // the agent's threads block the stop signals
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (getppid() != parent) _exit(kExecFailed);  // the agent already died
    dup2(out.write_end(), STDOUT_FILENO);
    dup2(err.write_end(), STDERR_FILENO);
    // execvpe looks argv[0] up in the agent's PATH.
    execvpe(args[0], args.data(), envp.data());
    const int error = errno;
    ssize_t ignored = write(exec_error.write_end(), &error, sizeof(error));
    (void)ignored;
    _exit(kExecFailed);
  }
  setpgid(pid, pid);  // also here, so the group exists before any Signal()
  out.CloseWriteEnd();
  err.CloseWriteEnd();
  exec_error.CloseWriteEnd();
  int error = 0;
  ssize_t got;
  while ((got = read(exec_error.read_end(), &error, sizeof(error))) < 0 &&
         errno == EINTR) {
  }
  if (got == sizeof(error)) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return absl::NotFoundError(
        absl::StrCat("cannot run '", argv[0], "': ", strerror(error)));
  }
  return std::unique_ptr<LocalProcess>(
      new LocalProcess(pid, out.TakeReadEnd(), err.TakeReadEnd()));
}

LocalProcess::~LocalProcess() {
  CloseIfOpen(&out_);
  CloseIfOpen(&err_);
}

int LocalProcess::TakeStdout() {
  const int fd = out_;
  out_ = -1;
  return fd;
}

int LocalProcess::TakeStderr() {
  const int fd = err_;
  err_ = -1;
  return fd;
}

int LocalProcess::Wait() {
  // Waits without reaping, then reaps under the lock: while the zombie
  // exists its pid (and group id) cannot be reused, so Signal() never hits
  // another process.
  siginfo_t info;
  while (waitid(P_PID, pid_, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  absl::MutexLock lock(&mu_);
  // What it left running in its group (a shell's background job, a pool
  // of workers it never stopped) dies with it, so that a restart does not
  // find them holding its GPU, ports or output pipes; unless the agent
  // signalled the group (a stop: its members keep their grace).
  if (!signalled_) kill(-pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  return ExitCodeOf(status);
}

void LocalProcess::Signal(int signal) {
  absl::MutexLock lock(&mu_);
  if (reaped_) return;
  kill(-pid_, signal);
  signalled_ = true;
}

}  // namespace gradsync
