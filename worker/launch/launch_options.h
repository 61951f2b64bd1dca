// The settings of `gradsync launch`, the node agent, parsed from a
// torchrun-style command line.
//
//   gradsync launch [FLAGS] [--] PROGRAM [ARGS...]
//
// Flags take `--name=value` or `--name value`, and `-` or `_` between words
// (`--nproc-per-node` is `--nproc_per_node`), as torchrun's do. torchrun's
// names for the coordinator and the job (`--rdzv_endpoint`, `--rdzv_id`) are
// accepted, and torchrun flags that only choose its own rendezvous
// (`--rdzv_backend`, `--rdzv_conf`, `--master_addr`, `--master_port`,
// `--max_restarts`'s companions) are accepted and ignored where gradsync's
// coordinator does their work, so a torchrun command line works after the
// program name is replaced. A PROGRAM ending in ".py" (or `-m MODULE`) runs
// under Python (`--python`, default python3), as torchrun runs it; anything
// else is executed directly (`--no_python` forces that).
#ifndef GRADSYNC_WORKER_LAUNCH_LAUNCH_OPTIONS_H_
#define GRADSYNC_WORKER_LAUNCH_LAUNCH_OPTIONS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradsync {

// Where a local process's stdout and stderr go besides the agent's console:
// torchrun's --redirects/--tee values (0 none, 1 stdout, 2 stderr, 3 both).
enum class StdStreams { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

// A --redirects/--tee setting: one value for every local process ("3"), or
// one per local rank ("0:1,1:2"; ranks not named get none), as torchrun's.
struct StdStreamsSetting {
  StdStreams all = StdStreams::kNone;
  std::map<int, StdStreams> by_local_rank;  // when given per rank

  StdStreams For(int local_rank) const;
  // Whether `stream` (1 stdout, 2 stderr) of local rank `local_rank` is in.
  bool Includes(int local_rank, int stream) const {
    return (static_cast<int>(For(local_rank)) & stream) != 0;
  }
};

// The devices a node offers its round: what the round's backend
// negotiation sees and what --nproc_per_node=gpu counts.
enum class LaunchDevice {
  kAuto,  // the NVIDIA GPUs the driver exposes (CountGpus), else none
  kCpu,   // none, GPUs or not
  kSim,   // GRADSYNC_SIM_DEVICES simulated GPUs (SimDeviceCount): host
          // memory through the NCCL backend's code paths, for tests
};

struct LaunchOptions {
  std::string coordinator;  // HOST:PORT[,HOST:PORT...]
  std::string job;
  std::string nnodes = "1";  // "N" or "MIN:MAX"
  // Processes on this node (resolved from N, "cpu", "gpu" or "auto",
  // "gpu" counting `device`'s GPUs).
  int nproc_per_node = 1;
  LaunchDevice device = LaunchDevice::kAuto;
  std::string node_id;  // empty: the hostname
  int max_restarts = 0;
  // How often the agent samples its processes (RSS) for heartbeats.
  absl::Duration monitor_interval = absl::Seconds(1);
  // With log_dir: each process's stdout and stderr are written to
  // LOG_DIR/attempt_<restart>/rank<R>/{stdout,stderr}.log (local<i> for
  // self-managed processes); `redirects` are
  // the streams that go only there, `tee` those that go there and to the
  // console.
  std::string log_dir;
  StdStreamsSetting redirects;
  StdStreamsSetting tee;
  std::string role = "default";
  // The address other nodes reach this one at (MASTER_ADDR when this node
  // has rank 0); empty: derived from the coordinator's address.
  std::string address;
  // "auto", "gloo" or "nccl": what the round negotiates (Assignment.backend).
  std::string backend = "auto";
  absl::Duration join_timeout = absl::Minutes(10);
  // How long stopped processes get between SIGTERM and SIGKILL.
  absl::Duration stop_timeout = absl::Seconds(10);
  // TLS toward the coordinator (see ClientTls).
  std::string tls_ca, tls_cert, tls_key;
  // The job's token file for a coordinator with --auth=token (default:
  // $GRADSYNC_TOKEN); the processes get the token as GRADSYNC_TOKEN.
  std::string token_file;
  std::string python = "python3";
  // The processes heartbeat and rejoin on their own (gradsync-worker):
  // see SelfManagedAgent. Set by --self_managed, or when the program's file name is
  // gradsync-worker.
  bool self_managed = false;
  // The command each process runs: [python, -u, script or -m module,] args.
  std::vector<std::string> command;
};

// Parses `args` (the words after "launch"). INVALID_ARGUMENT naming the
// flag for an unknown flag, a missing or malformed value, no coordinator or
// job, or no program.
absl::StatusOr<LaunchOptions> ParseLaunchArgs(
    const std::vector<std::string>& args);

// The flags, for --help.
extern const char kLaunchUsage[];

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_LAUNCH_OPTIONS_H_
