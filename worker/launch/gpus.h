// What the node agent knows about this machine's NVIDIA GPUs, without
// linking CUDA: how many the driver sees, whether NCCL can be loaded, and
// how much GPU memory each process uses (nvidia-smi).
#ifndef GRADSYNC_WORKER_LAUNCH_GPUS_H_
#define GRADSYNC_WORKER_LAUNCH_GPUS_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

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

// ParseComputeApps of a run of nvidia-smi; empty when it cannot run.
// Blocks for the run (tens of milliseconds): call it outside locks.
std::map<pid_t, int64_t> GpuMemoryByPid();

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_GPUS_H_
