#include "worker/launch/gpus.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "worker/launch/local_process.h"

extern char** environ;

namespace gradsync {

int CountGpus() {
  DIR* dir = opendir("/proc/driver/nvidia/gpus");
  if (dir == nullptr) return 0;
  int gpus = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++gpus;
  }
  closedir(dir);
  return gpus;
}

bool NcclLoadable() {
  void* nccl = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
  if (nccl == nullptr) return false;
  dlclose(nccl);
  return true;
}

std::map<pid_t, int64_t> ParseComputeApps(const std::string& csv) {
  std::map<pid_t, int64_t> bytes;
  for (absl::string_view line : absl::StrSplit(csv, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    int pid = 0;
    int64_t mib = 0;
    if (fields.size() != 2 ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[0]), &pid) ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[1]), &mib)) {
      continue;
    }
    bytes[pid] += mib << 20;
  }
  return bytes;
}

std::vector<std::string> ComputeAppsCommand() {
  return {"nvidia-smi", "--query-compute-apps=pid,used_memory",
          "--format=csv,noheader,nounits"};
}

absl::StatusOr<std::map<pid_t, int64_t>> GpuMemoryByPid(
    const std::vector<std::string>& command, absl::Duration timeout) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    env.emplace_back(*entry);
  }
  absl::StatusOr<std::unique_ptr<LocalProcess>> smi =
      LocalProcess::Start(command, env);
  if (!smi.ok()) return std::map<pid_t, int64_t>();  // no nvidia-smi
  close((*smi)->TakeStderr());
  const int out = (*smi)->TakeStdout();
  const absl::Time deadline = absl::Now() + timeout;
  std::string csv;
  bool ended = false;
  while (!ended) {
    const absl::Duration left = deadline - absl::Now();
    pollfd readable{out, POLLIN, 0};
    if (left <= absl::ZeroDuration() ||
        poll(&readable, 1,
             static_cast<int>(absl::ToInt64Milliseconds(left) + 1)) == 0) {
      break;
    }
    char buffer[4096];
    const ssize_t n = read(out, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ended = true;
    } else {
      csv.append(buffer, static_cast<size_t>(n));
    }
  }
  close(out);
  if (!ended) {
    // Killed; one stuck in the driver (uninterruptible) dies only when the
    // call returns: a thread of its own reaps it then.
    (*smi)->Signal(SIGKILL);
    std::thread([process = *std::move(smi)] { process->Wait(); }).detach();
    return absl::DeadlineExceededError(absl::StrCat(
        command[0], " did not answer within ", absl::FormatDuration(timeout)));
  }
  (*smi)->Wait();
  return ParseComputeApps(csv);
}

}  // namespace gradsync
