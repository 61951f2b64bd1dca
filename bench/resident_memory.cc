#include "bench/resident_memory.h"

#include <cinttypes>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace gradsync {

int64_t ResidentBytes(int pid) {
  const std::string path =
      pid > 0 ? absl::StrCat("/proc/", pid, "/status") : "/proc/self/status";
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %" SCNd64 " kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib * 1024;
}

}  // namespace gradsync
