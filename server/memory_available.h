// How much memory this process may use, for limits set as a share of it
// (the coordinator's --transport_memory_limit=25%): the smallest cgroup memory
// limit on the process's cgroup path and its ancestors (cgroup v2's
// memory.max, or v1's memory.limit_in_bytes: what a systemd unit's
// MemoryMax= or a container's memory limit sets), and never more than the
// machine's memory (MemTotal).
//
// Thread-safe: a function of the files it reads; nothing is kept.
#ifndef GRADSYNC_SERVER_MEMORY_AVAILABLE_H_
#define GRADSYNC_SERVER_MEMORY_AVAILABLE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

struct MemoryAvailable {
  int64_t bytes = 0;
  // Where `bytes` comes from, for a log line: "the machine's memory" or
  // "cgroup /system.slice/gradsync.service's memory.max".
  std::string source;
};

// Reads `root`/proc/self/cgroup, the cgroup files under
// `root`/sys/fs/cgroup and `root`/proc/meminfo ("/" in production; a
// directory of fixtures in tests). A cgroup file that is missing or says
// "max" sets no limit. NOT_FOUND or INVALID_ARGUMENT when the machine's
// memory cannot be read.
absl::StatusOr<MemoryAvailable> MemoryAvailableToThisProcess(
    absl::string_view root = "/");

// A memory limit given as "0" (none), a number of bytes, or a share of
// what this process may use ("25%", of MemoryAvailableToThisProcess(root)).
struct MemoryLimit {
  int64_t bytes = 0;  // 0: none
  // How it was set, for a log line: "25% of the machine's memory (24105
  // MiB)", "4096 MiB" or "none".
  std::string description;
};
// INVALID_ARGUMENT naming the accepted forms for anything else (a
// negative number, a share over 100%); the errors of
// MemoryAvailableToThisProcess for a share that cannot be sized.
absl::StatusOr<MemoryLimit> ParseMemoryLimit(absl::string_view spec,
                                             absl::string_view root = "/");

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_MEMORY_AVAILABLE_H_
