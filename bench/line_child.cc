#include "bench/line_child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gradsync {

absl::StatusOr<std::unique_ptr<LineChild>> LineChild::Start(
    const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("no command");
  // Built before fork(): the child may only call async-signal-safe
  // functions until it execs (the parent has threads).
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int to[2];
  int from[2];
  if (pipe2(to, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  if (pipe2(from, O_CLOEXEC) != 0) {
    close(to[0]);
    close(to[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to[0], STDIN_FILENO);     // dup2 clears O_CLOEXEC on the copies
    dup2(from[1], STDOUT_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  if (pid < 0) {
    close(to[1]);
    close(from[0]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  return std::unique_ptr<LineChild>(new LineChild(pid, to[1], from[0]));
}

LineChild::~LineChild() {
  if (to_ >= 0) close(to_);
  close(from_);
  Kill();
}

absl::StatusOr<std::string> LineChild::Ask(const std::string& command,
                                           absl::Duration bound) {
  if (!command.empty()) {
    const std::string line = command + "\n";
    // A line this short goes into the pipe at once (or the child is gone:
    // EPIPE, with SIGPIPE ignored by the caller).
    if (to_ < 0 || write(to_, line.data(), line.size()) !=
                       static_cast<ssize_t>(line.size())) {
      return absl::UnavailableError(
          absl::StrCat("cannot write '", command, "' to the child"));
    }
  }
  const absl::Time deadline = absl::Now() + bound;
  for (;;) {
    const size_t end = buffered_.find('\n');
    if (end != std::string::npos) {
      std::string line = buffered_.substr(0, end);
      buffered_.erase(0, end + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the child did not answer '", command, "' within ",
          absl::FormatDuration(bound)));
    }
    pollfd fd{from_, POLLIN, 0};
    const int ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    if (poll(&fd, 1, ms) <= 0) continue;  // timed out (or EINTR): look again
    char chunk[256];
    const ssize_t n = read(from_, chunk, sizeof chunk);
    if (n > 0) {
      buffered_.append(chunk, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(
          "the child closed its output before answering '", command, "'"));
    }
  }
}

absl::Status LineChild::Close(absl::Duration bound) {
  if (to_ >= 0) {
    close(to_);
    to_ = -1;
  }
  const absl::Time deadline = absl::Now() + bound;
  int status = 0;
  while (pid_ > 0) {
    const pid_t reaped = waitpid(pid_, &status, WNOHANG);
    if (reaped == pid_) {
      pid_ = -1;
      break;
    }
    if (reaped < 0 && errno != EINTR) {
      pid_ = -1;
      return absl::InternalError(
          absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    if (absl::Now() >= deadline) {
      Kill();
      return absl::DeadlineExceededError(absl::StrCat(
          "the child did not exit within ", absl::FormatDuration(bound),
          " of its input closing: killed"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(
      WIFEXITED(status)
          ? absl::StrCat("the child exited with ", WEXITSTATUS(status))
          : absl::StrCat("the child was killed by signal ", WTERMSIG(status)));
}

void LineChild::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace gradsync
