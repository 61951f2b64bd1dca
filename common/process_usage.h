// What a process uses, read from Linux's /proc: its resident memory and its
// CPU time. The one home for these readings (the worker's telemetry, the
// node agent's reports on its workers and the benchmarks use it).
#ifndef GRADSYNC_COMMON_PROCESS_USAGE_H_
#define GRADSYNC_COMMON_PROCESS_USAGE_H_

#include <cstdint>

namespace gradsync {

// The resident memory of process `pid` (0: this one), in bytes, from
// /proc/PID/statm; 0 when unknown (no such process, /proc unreadable).
// Thread-safe.
int64_t ResidentBytes(int pid);

// The CPU time (user + system) process `pid` (0: this one) has used, in
// seconds, from /proc/PID/stat; 0 when unknown. Thread-safe.
double CpuSeconds(int pid);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_PROCESS_USAGE_H_
