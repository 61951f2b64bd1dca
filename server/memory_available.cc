#include "server/memory_available.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gradsync {
namespace {

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// A cgroup limit file's value in bytes; nullopt for "max", a missing file
// or anything that is not a number.
std::optional<int64_t> ReadLimit(const std::string& path) {
  std::optional<std::string> text = ReadWholeFile(path);
  if (!text.has_value()) return std::nullopt;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &bytes) ||
      bytes <= 0) {
    return std::nullopt;
  }
  return bytes;
}

// A cgroup's path and its ancestors, itself first: "/a/b", "/a", "/".
std::vector<std::string> SelfAndAncestors(absl::string_view path) {
  std::vector<std::string> paths;
  std::string current(path.empty() ? "/" : path);
  while (true) {
    paths.push_back(current);
    if (current == "/") break;
    const size_t slash = current.rfind('/');
    current = slash == 0 || slash == std::string::npos
                  ? "/"
                  : current.substr(0, slash);
  }
  return paths;
}

// Where the memory controller's files are for /proc/self/cgroup's lines:
// cgroup v2 ("0::PATH") or v1 ("N:...memory...:PATH").
struct CgroupFiles {
  std::string directory;  // under `root`
  std::string path;
  std::string limit_file;
};

std::optional<CgroupFiles> MemoryCgroup(absl::string_view proc_self_cgroup) {
  std::optional<CgroupFiles> v2;
  for (absl::string_view line :
       absl::StrSplit(proc_self_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    if (fields[0] == "0" && fields[1].empty()) {
      v2 = CgroupFiles{"sys/fs/cgroup", std::string(fields[2]), "memory.max"};
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',')) {
      if (controller == "memory") {
        return CgroupFiles{"sys/fs/cgroup/memory", std::string(fields[2]),
                           "memory.limit_in_bytes"};
      }
    }
  }
  return v2;
}

// MemTotal of /proc/meminfo, in bytes.
absl::StatusOr<int64_t> MachineMemory(const std::string& meminfo_path) {
  std::optional<std::string> meminfo = ReadWholeFile(meminfo_path);
  if (!meminfo.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", meminfo_path, " (the machine's memory)"));
  }
  for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (absl::ConsumeSuffix(&line, "kB") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) && kib > 0) {
      return kib * 1024;
    }
    break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(meminfo_path, " has no MemTotal line in kB"));
}

}  // namespace

absl::StatusOr<MemoryAvailable> MemoryAvailableToThisProcess(
    absl::string_view root) {
  const std::string base =
      absl::StrCat(absl::StripSuffix(root, "/"), "/");
  absl::StatusOr<int64_t> machine =
      MachineMemory(absl::StrCat(base, "proc/meminfo"));
  if (!machine.ok()) return machine.status();
  MemoryAvailable available{*machine, "the machine's memory"};
  std::optional<std::string> self =
      ReadWholeFile(absl::StrCat(base, "proc/self/cgroup"));
  if (!self.has_value()) return available;
  std::optional<CgroupFiles> cgroup = MemoryCgroup(*self);
  if (!cgroup.has_value()) return available;
  for (const std::string& path : SelfAndAncestors(cgroup->path)) {
    const std::string file =
        absl::StrCat(base, cgroup->directory,
                     path == "/" ? "" : path, "/", cgroup->limit_file);
    std::optional<int64_t> limit = ReadLimit(file);
    if (limit.has_value() && *limit < available.bytes) {
      available.bytes = *limit;
      available.source =
          absl::StrCat("cgroup ", path, "'s ", cgroup->limit_file);
    }
  }
  return available;
}

absl::StatusOr<MemoryLimit> ParseMemoryLimit(absl::string_view spec,
                                             absl::string_view root) {
  const absl::Status invalid = absl::InvalidArgumentError(absl::StrCat(
      "memory limit '", spec,
      "': expected 0 (none), a number of bytes or a share such as 25% of "
      "the memory this process may use"));
  absl::string_view number = absl::StripAsciiWhitespace(spec);
  if (!absl::ConsumeSuffix(&number, "%")) {
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(number, &bytes) || bytes < 0) return invalid;
    if (bytes == 0) return MemoryLimit{0, "none"};
    return MemoryLimit{bytes, absl::StrCat(bytes >> 20, " MiB")};
  }
  double percent = 0;
  if (!absl::SimpleAtod(number, &percent) || !(percent > 0) ||
      percent > 100) {
    return invalid;
  }
  absl::StatusOr<MemoryAvailable> available =
      MemoryAvailableToThisProcess(root);
  if (!available.ok()) {
    return absl::Status(
        available.status().code(),
        absl::StrCat(available.status().message(),
                     ": cannot size a share of it; give a number of bytes"));
  }
  const auto bytes =
      static_cast<int64_t>(static_cast<double>(available->bytes) * percent /
                           100);
  return MemoryLimit{
      bytes, absl::StrCat(number, "% of ", available->source, " (",
                          available->bytes >> 20, " MiB): ", bytes >> 20,
                          " MiB")};
}

}  // namespace gradsync
