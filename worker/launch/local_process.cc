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
  int out[2], err[2], exec_error[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
      pipe2(exec_error, O_CLOEXEC) != 0) {
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
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    // execvpe looks argv[0] up in the agent's PATH.
    execvpe(args[0], args.data(), envp.data());
    const int error = errno;
    ssize_t ignored = write(exec_error[1], &error, sizeof(error));
    (void)ignored;
    _exit(kExecFailed);
  }
  setpgid(pid, pid);  // also here, so the group exists before any Signal()
  close(out[1]);
  close(err[1]);
  close(exec_error[1]);
  int error = 0;
  const ssize_t got = read(exec_error[0], &error, sizeof(error));
  close(exec_error[0]);
  if (got == sizeof(error)) {
    waitpid(pid, nullptr, 0);
    close(out[0]);
    close(err[0]);
    return absl::NotFoundError(
        absl::StrCat("cannot run '", argv[0], "': ", strerror(error)));
  }
  return std::unique_ptr<LocalProcess>(new LocalProcess(pid, out[0], err[0]));
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
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  return ExitCodeOf(status);
}

void LocalProcess::Signal(int signal) {
  absl::MutexLock lock(&mu_);
  if (!reaped_) kill(-pid_, signal);
}

}  // namespace gradsync
