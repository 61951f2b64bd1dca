#include "worker/launch/gpus.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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

std::map<pid_t, int64_t> GpuMemoryByPid() {
  FILE* smi = popen(
      "nvidia-smi --query-compute-apps=pid,used_memory "
      "--format=csv,noheader,nounits 2>/dev/null",
      "r");
  if (smi == nullptr) return {};
  std::string csv;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), smi)) > 0;) {
    csv.append(buffer, n);
  }
  pclose(smi);
  return ParseComputeApps(csv);
}

}  // namespace gradsync
