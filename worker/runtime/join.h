// What a worker process sends to join a job, built from its settings: the
// part every worker binary (the trainer, the simulated worker) shares.
#ifndef GRADSYNC_WORKER_RUNTIME_JOIN_H_
#define GRADSYNC_WORKER_RUNTIME_JOIN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/rendezvous.pb.h"

namespace gradsync {

// A worker's join settings, as its flags give them.
struct JoinConfig {
  std::string job_id;
  // Nodes per round: "N" or "MIN:MAX".
  std::string nnodes = "1";
  int nproc_per_node = 1;
  // Groups processes into nodes; empty: the hostname.
  std::string node_id;
  // "auto", "gloo" or "nccl".
  std::string backend = "auto";
  // "recover", "fail" or "" (the job's default: recover).
  std::string failure_policy;
  // "heal", "fail" or "" (the job's default: heal).
  std::string divergence_policy;
  // "rebalance", "report" or "" (the job's default: rebalance).
  std::string straggler_policy;
  // How late a rank's first gradient bucket must be, consistently, to flag
  // it a straggler; zero: the coordinator's default.
  absl::Duration straggler_threshold;
  absl::Duration join_timeout = absl::Minutes(10);
  absl::Duration last_call_timeout = absl::Seconds(30);
  // The address the other workers reach this process at.
  std::string address;
  // What this process can train on.
  v1::DeviceType device_type = v1::DEVICE_TYPE_CPU;
  int device_count = 0;
  bool nccl_available = false;
};

// The JoinRequest for `config`, with a fresh incarnation id. INVALID_ARGUMENT
// for a bad job id, node range, backend, failure policy or an empty address.
absl::StatusOr<v1::JoinRequest> BuildJoinRequest(const JoinConfig& config);

// The address to advertise when the user gave none: loopback when the
// coordinator is on loopback (everything on this machine), else this
// machine's hostname.
std::string DefaultWorkerAddress(const std::string& coordinator_target);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_JOIN_H_
