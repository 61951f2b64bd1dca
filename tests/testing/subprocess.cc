#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

extern char** environ;

namespace gradsync {
namespace testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "gradsync", "/", path);
}

std::string TempPath(const std::string& name) {
  // A folder per process: ctest runs the cases of one binary as concurrent
  // processes that share TEST_TMPDIR.
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/p", getpid());
  mkdir(dir.c_str(), 0755);  // EEXIST after the first call
  return absl::StrCat(dir, "/", name);
}

::testing::AssertionResult RunPython(const std::string& name,
                                     const std::string& script,
                                     absl::Duration bound) {
  const std::string path = TempPath(name + ".py");
  {
    std::ofstream file(path, std::ios::trunc);
    file << script;
    if (!file) return ::testing::AssertionFailure() << "cannot write " << path;
  }
  Child python;
  if (!python.Start({"/usr/bin/python3", path}, /*capture=*/true)) {
    return ::testing::AssertionFailure() << "cannot start /usr/bin/python3";
  }
  if (!WaitAll({&python}, bound)) {
    return ::testing::AssertionFailure()
           << name << " did not finish within " << absl::FormatDuration(bound)
           << ":\n" << python.describe();
  }
  if (python.exit_code() != 0) {
    return ::testing::AssertionFailure() << python.describe();
  }
  return ::testing::AssertionSuccess();
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

Child::~Child() {
  if (running()) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  CloseFd(&out_fd_);
  CloseFd(&err_fd_);
}

bool Child::Start(const std::vector<std::string>& argv, bool capture) {
  argv_ = absl::StrJoin(argv, " ");
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (capture) {
    // O_CLOEXEC: no other child inherits these pipes, so each one reaches
    // EOF when its own process exits.
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << strerror(errno);
      return false;
    }
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));
  }
  args.push_back(nullptr);
  int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (capture) {
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << argv_ << ": " << strerror(rc);
    pid_ = -1;
    CloseFd(&out_fd_);
    CloseFd(&err_fd_);
    return false;
  }
  return true;
}

int Child::exit_code() const {
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

bool Child::killed_by(int signal_number) const {
  return exited_ && WIFSIGNALED(status_) && WTERMSIG(status_) == signal_number;
}

std::string Child::describe() const {
  std::string how =
      exited_ ? (WIFEXITED(status_) ? absl::StrCat("exit ", exit_code())
                                    : absl::StrCat("signal ", WTERMSIG(status_)))
              : "running";
  return absl::StrCat("`", argv_, "` (", how, ")\nstdout: ", out_,
                      "\nstderr: ", err_);
}

bool Child::Reap() {
  if (!running()) return exited_;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    status_ = status;
  }
  return exited_;
}

void Child::AddPollFds(std::vector<pollfd>* fds) const {
  for (int fd : {out_fd_, err_fd_}) {
    if (fd >= 0) fds->push_back(pollfd{fd, POLLIN, 0});
  }
}

void Child::Pump(const std::vector<pollfd>& ready) {
  for (const pollfd& p : ready) {
    if (p.revents == 0) continue;
    if (p.fd == out_fd_) Drain(&out_fd_, &out_);
    if (p.fd == err_fd_) Drain(&err_fd_, &err_);
  }
}

void Child::Signal(int signal_number) {
  if (running()) kill(pid_, signal_number);
}

void Child::CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

void Child::Drain(int* fd, std::string* into) {
  char buffer[4096];
  ssize_t n = read(*fd, buffer, sizeof(buffer));
  if (n > 0) {
    into->append(buffer, n);
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    CloseFd(fd);
  }
}

bool WaitAll(const std::vector<Child*>& children, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  while (true) {
    bool all_done = true;
    std::vector<pollfd> fds;
    for (Child* c : children) {
      c->AddPollFds(&fds);
      if (!c->Reap() || c->pipes_open()) all_done = false;
    }
    if (all_done) return true;
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    int timeout_ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 20));
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n > 0) {
      for (Child* c : children) c->Pump(fds);
    }
  }
  for (Child* c : children) {
    if (c->running()) {
      c->Signal(SIGKILL);
      int status = 0;
      waitpid(c->pid(), &status, 0);
      c->Reap();
    }
  }
  return false;
}

::testing::AssertionResult CoordinatorProcess::Start(
    const std::string& binary, const std::string& name,
    const std::vector<std::string>& flags) {
  std::string file_name = absl::StrCat("port-", name);
  for (char& c : file_name) {
    if (c == '/') c = '_';
  }
  const std::string port_file = TempPath(file_name);
  unlink(port_file.c_str());
  std::vector<std::string> argv = {binary, "--listen=127.0.0.1:0",
                                   absl::StrCat("--port_file=", port_file),
                                   "--poll_interval=5ms",
                                   "--shutdown_grace=500ms"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  if (!child_.Start(argv, /*capture=*/false)) {
    return ::testing::AssertionFailure() << "cannot start " << binary;
  }
  // The port file appears once the coordinator serves. Polled with a short
  // pause: it is written by another process.
  constexpr absl::Duration kStartBound = absl::Seconds(20);
  const absl::Time deadline = absl::Now() + kStartBound;
  while (true) {
    if (child_.Reap()) {
      return ::testing::AssertionFailure()
             << "the coordinator exited before serving: " << child_.describe();
    }
    std::ifstream in(port_file);
    std::string text((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    // Complete once the newline is there.
    if (!text.empty() && text.back() == '\n' &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port_)) {
      break;
    }
    if (absl::Now() >= deadline) {
      return ::testing::AssertionFailure()
             << "no port file " << port_file << " after "
             << absl::FormatDuration(kStartBound);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (port_ <= 0 || port_ >= 65536) {
    return ::testing::AssertionFailure() << "bad port " << port_;
  }
  address_ = absl::StrCat("127.0.0.1:", port_);
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult CoordinatorProcess::Stop(absl::Duration bound) {
  const absl::Time start = absl::Now();
  child_.Signal(SIGTERM);
  if (!WaitAll({&child_}, bound)) {
    return ::testing::AssertionFailure()
           << "the coordinator ignored SIGTERM for "
           << absl::FormatDuration(bound);
  }
  if (child_.exit_code() != 0) {
    return ::testing::AssertionFailure()
           << "the coordinator did not exit 0: " << child_.describe();
  }
  if (absl::Now() - start >= bound) {
    return ::testing::AssertionFailure() << "stopping took too long";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing
}  // namespace gradsync
