// What the node agent knows about this machine's NVIDIA GPUs, without
// linking CUDA: how many the driver sees, whether NCCL can be loaded, and
// how much GPU memory each process uses (nvidia-smi).
#ifndef GRADSYNC_WORKER_LAUNCH_GPUS_H_
#define GRADSYNC_WORKER_LAUNCH_GPUS_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradsync {

// NVIDIA GPUs the driver exposes (/proc/driver/nvidia/gpus); 0 without a
// driver.
int CountGpus();

// Whether libnccl.so.2 can be loaded.
bool NcclLoadable();

// GPU memory by process id from nvidia-smi's compute-apps query output
// ("PID, USED_MIB" lines, csv without header or units); lines that do not
// parse (e.g. "[N/A]") are skipped. A process on several GPUs is summed.
std::map<pid_t, int64_t> ParseComputeApps(const std::string& csv);

// nvidia-smi's query of the memory each process uses on the GPUs.
std::vector<std::string> ComputeAppsCommand();

// ParseComputeApps of what `command` (ComputeAppsCommand) prints; empty
// when it cannot run. Blocks for the run (tens of milliseconds), at most
// `timeout`: nvidia-smi can hang for minutes on a GPU that fell off the bus,
// and is then killed (DEADLINE_EXCEEDED). Call it outside locks.
absl::StatusOr<std::map<pid_t, int64_t>> GpuMemoryByPid(
    const std::vector<std::string>& command, absl::Duration timeout);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_GPUS_H_
