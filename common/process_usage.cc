#include "common/process_usage.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradsync {
namespace {

std::string ProcPath(int pid, const char* file) {
  return pid > 0 ? absl::StrCat("/proc/", pid, "/", file)
                 : absl::StrCat("/proc/self/", file);
}

}  // namespace

int64_t ResidentBytes(int pid) {
  std::ifstream statm(ProcPath(pid, "statm"));
  int64_t pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return resident * sysconf(_SC_PAGESIZE);
}

double CpuSeconds(int pid) {
  std::ifstream stat(ProcPath(pid, "stat"));
  std::string line;
  if (!std::getline(stat, line)) return 0;
  // Fields after the command (which may hold spaces) in parentheses:
  // state is field 3, utime 14 and stime 15.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return 0;
  std::vector<std::string> fields =
      absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace gradsync
