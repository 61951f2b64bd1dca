// The environment `gradsync launch` gives each process: torchrun's
// variables, so a script written for torchrun (env:// init, LOCAL_RANK, ...)
// runs unchanged, plus gradsync's own.
#ifndef GRADSYNC_WORKER_LAUNCH_TORCHRUN_ENV_H_
#define GRADSYNC_WORKER_LAUNCH_TORCHRUN_ENV_H_

#include <map>
#include <string>
#include <vector>

#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

// What the node agent knows beyond a process's assignment.
struct AgentContext {
  std::string role = "default";
  std::string coordinator;
  // Where rank 0's process serves the c10d TCPStore (env:// init).
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  // Where processes send their own metrics (MetricsInbox); empty: nowhere.
  std::string agent_socket;
  // Where each process's stacks file is (process_stacks.h); empty: none.
  std::string stacks_dir;
};

// The stacks file of the process with local rank `local_rank`.
std::string StacksFile(const AgentContext& context, int local_rank);

// The variables for the process of `assignment`: RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,
// ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
// TORCHELASTIC_RUN_ID (the job), TORCHELASTIC_USE_AGENT_STORE=False (rank 0
// hosts the store: there is no agent store), GRADSYNC_COORDINATOR,
// GRADSYNC_JOB, GRADSYNC_ROUND, GRADSYNC_BACKEND, GRADSYNC_AGENT_SOCKET (when
// set in `context`), GRADSYNC_STACKS_FILE and GRADSYNC_STACKS_SIGNAL (when
// `context` has a stacks_dir; see worker/launch/process_stacks.h). Every node runs one role,
// so role ranks are global ranks.
std::map<std::string, std::string> TorchrunVariables(
    const v1::Assignment& assignment, const AgentContext& context);

// `base` ("NAME=VALUE" entries, e.g. the agent's environ) with `variables`
// set over it, and, unless `base` sets them, as torchrun does:
// OMP_NUM_THREADS=1 when `nproc_per_node` > 1 (several processes share the
// node's cores) and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (ProcessGroupNCCL
// tears a process down on an NCCL error or timeout instead of leaving it
// hung); and glibc's MALLOC_MMAP_THRESHOLD_=33554432 and
// MALLOC_TRIM_THRESHOLD_=1073741824, so that freed tensors stay with the
// process instead of being unmapped and faulted in again every step (what
// gradsync-worker sets for itself; PyTorch DDP's ResNet-18 step here: 360 ms
// without them, 141 ms with them, BENCHMARKS.md).
std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::map<std::string, std::string>& variables, int nproc_per_node);

// Where the gradsync Python package is installed beside `executable` (the
// gradsync command): PREFIX/lib/python3/dist-packages for PREFIX/bin/gradsync,
// when it holds gradsync/__init__.py (the python3-gradsync package unpacked
// under the same prefix) and PREFIX is not /usr, whose dist-packages are on
// Debian Python's path already. Empty otherwise.
std::string PackagedPythonPath(const std::string& executable);

// `environment` ("NAME=VALUE" entries) with `folder` appended to PYTHONPATH,
// after what it had (the user's own entries win); unchanged for an empty
// `folder` or one PYTHONPATH lists already.
std::vector<std::string> WithPythonPath(std::vector<std::string> environment,
                                        const std::string& folder);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_TORCHRUN_ENV_H_
