// The resident memory of a process, as the benchmarks report it.
#ifndef GRADSYNC_BENCH_RESIDENT_MEMORY_H_
#define GRADSYNC_BENCH_RESIDENT_MEMORY_H_

#include <cstdint>

namespace gradsync {

// The resident memory (VmRSS) of process `pid` (0: this one), in bytes; 0
// when unknown (no such process, or /proc unreadable). Thread-safe.
int64_t ResidentBytes(int pid);

}  // namespace gradsync

#endif  // GRADSYNC_BENCH_RESIDENT_MEMORY_H_
