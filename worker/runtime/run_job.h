// Running a training loop as a member of a gradsync job: joining it (or
// taking the assignment `gradsync launch` made for this process), building
// each round's process group, heartbeating with the loop's steps, recovering
// in place when a peer is lost (the loop is called again in the next round),
// and reporting how it ended. gradsync-worker runs its own trainer this way;
// users' loops run the same (the public header is gradsync/job.h).
//
//   class MyTrainer : public gradsync::Trainer { ... };
//   gradsync::JobOptions options;
//   options.coordinator = "10.0.0.1:29400";
//   options.job = "resnet";
//   MyTrainer trainer;
//   absl::Status done = gradsync::RunJob(options, &trainer);
#ifndef GRADSYNC_WORKER_RUNTIME_RUN_JOB_H_
#define GRADSYNC_WORKER_RUNTIME_RUN_JOB_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "worker/backend/backend.h"
#include "worker/backend/nccl_faults.h"
#include "worker/ddp/replica_digest.h"
#include "worker/runtime/step_report.h"

namespace gradsync {

// Where the job is and how this process takes part. Under `gradsync launch`
// the launcher's coordinator, job and join settings are used instead of
// coordinator, job, nnodes, nproc_per_node, node_id, backend and address.
struct JobOptions {
  // "HOST:PORT", or the replicas "HOST:PORT,HOST:PORT".
  std::string coordinator = "127.0.0.1:29400";
  // The job's id (created by the first join unless the coordinator runs with
  // tokens).
  std::string job;
  // Nodes per round, "N" or "MIN:MAX", and worker processes per node.
  std::string nnodes = "1";
  int nproc_per_node = 1;
  // Groups processes into nodes; empty: this host's name.
  std::string node_id;
  // "auto", "gloo" or "nccl".
  std::string backend = "auto";
  // "recover", "fail" or "" (the job's default: recover).
  std::string failure_policy;
  // "heal", "fail" or "" (the job's default: heal).
  std::string divergence_policy;
  // "rebalance", "report" or "" (the job's default: rebalance), and the
  // straggler threshold (zero: the coordinator's): see JoinConfig.
  std::string straggler_policy;
  absl::Duration straggler_threshold;
  // Whether the trainer runs an exact global batch (--global_batch_size):
  // its rounds may then re-form to move micro-batches between ranks.
  bool exact_global_batch = false;
  // The address other ranks reach this process at; empty: loopback for a
  // coordinator on loopback, else this host's name. Or a network interface
  // for Gloo to bind.
  std::string address;
  std::string network_interface;
  // Gloo rounds on one host run over shared memory.
  bool shared_memory = true;
  // Where the process trains: the CPU, CUDA, or SIM (a simulated GPU:
  // host memory through the GPU code paths and NCCL over shared memory, for
  // tests without a GPU). On "cuda" and "sim" it advertises its devices and
  // NCCL, picks its device once (the one its first assignment's local rank
  // names, the launcher's for a launched process; a local rank past the
  // devices it sees fails) and keeps it for its whole life.
  v1::DeviceType device = v1::DEVICE_TYPE_CPU;
  // Devices visible; 0: as the device type finds them (CUDA's count,
  // GRADSYNC_SIM_DEVICES).
  int device_count = 0;
  // Faults injected into the NCCL backend's collectives (failpoints, tests);
  // none when empty.
  CommFaultPlan nccl_faults;
  // Process group bootstrap and per-collective timeout; the rendezvous's.
  absl::Duration timeout = absl::Minutes(5);
  // A collective's timeout that follows the round's step times, within
  // [min, timeout] (factor 0: off; see collective_watchdog.h).
  double collective_timeout_factor = 10;
  absl::Duration min_collective_timeout = absl::Seconds(10);
  absl::Duration join_timeout = absl::Minutes(10);
  absl::Duration last_call_timeout = absl::Seconds(30);
  // How often a failed round may be re-formed before giving up.
  int max_recoveries = 3;
  // A file holding the job's token (--auth=token coordinators); empty: the
  // GRADSYNC_TOKEN variable, if set.
  std::string token_file;
  // Answers the coordinator's requests for this process's stacks (a hang
  // verdict); unset: the stacks of its native threads
  // (HealthReporterOptions::capture_stacks). A Python loop's are its
  // Python threads' (python/ext/job.cc).
  std::function<v1::ThreadStacks(int64_t request)> capture_stacks;
  // TLS toward the coordinator: its CA, and a client certificate and key
  // when it asks for one.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};

// One round of the job, as the training loop sees it. Valid during the
// Trainer::Train call it is passed to.
struct Round {
  int64_t number = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int node_rank = 0;
  int num_nodes = 1;
  // The backend the round negotiated: "gloo" or "nccl" (a Gloo round on one
  // host runs over shared memory).
  std::string backend_name;
  // The rank whose training state every rank copies first: the one with
  // the most committed steps (a recovered round's survivor).
  int source_rank = 0;
  // With an exact global batch: each rank's micro-batches per step, by
  // rank (Assignment.micro_batch_shares); empty: an even division.
  std::vector<int> micro_batch_shares;
  // The round's process group (collectives are recorded for heartbeats).
  Backend* backend = nullptr;
  // On "cuda" and "sim": the device this process uses, the same in every
  // round, and its name ("cuda:0", "sim:3").
  int device_index = 0;
  std::string device_name;
  // Call after every committed step (cheap): heartbeats carry it, and the
  // coordinator's diagnosis of stragglers, hangs and desyncs uses it.
  // InvalidArgument: a report CheckStepReport refuses, which changes
  // nothing; FailedPrecondition: the coordinator failed the job, stop
  // training with it.
  std::function<absl::Status(const StepReport& report, int64_t samples)>
      report_step;
  // Sends the fingerprint of this rank's replica as committed step `step`
  // left it, apart from that step's report (which can carry one:
  // StepReport::fingerprint), e.g. after the last step. The coordinator
  // compares the ranks' fingerprints of a step (divergence detection).
  std::function<void(int64_t step, const ReplicaDigest& digest)>
      report_fingerprint;
  // Call once, after the round's first step: how long copying the state and
  // that step took (shown in the job's status).
  std::function<void(absl::Duration state_transfer, absl::Duration first_step)>
      report_round_start;
  // Set when the round may grow (MIN:MAX nodes with room), or may be
  // rebalanced (an exact global batch, StragglerPolicy REBALANCE): after each step,
  // whether the coordinator asks the ranks to re-form the round at a step
  // boundary (see TrainContext::reform_requested in worker/trainer).
  std::function<bool()> reform_requested;
  // Blocks until the coordinator ended this member's round: for a loop
  // that stands still on purpose (the failpoint hang:STEP), as a hung rank
  // would, and must go on once its round is over.
  std::function<void()> await_round_over;
};

// A training loop that keeps its state across rounds. Used by one thread.
class Trainer {
 public:
  virtual ~Trainer() = default;
  // Trains in `round` until training is done (OK) or it fails. It should
  // start by making every rank's state rank round.source_rank's (e.g. with
  // BroadcastTrainingState), and keep the state of its last committed step
  // when it fails. Return a collective's status when one fails
  // (UNAVAILABLE: a peer left; DEADLINE_EXCEEDED; ABORTED: the round was
  // superseded): the job re-forms the round without the lost peer (or with
  // a spare) and calls Train again. Other errors end the job.
  virtual absl::Status Train(const Round& round) = 0;
  // Optimizer steps committed, and whether the loop holds state worth
  // copying to others (sent with every rejoin, so that the coordinator
  // picks the source rank).
  virtual int64_t committed_step() const = 0;
  virtual bool has_state() const { return committed_step() > 0; }
  // Called after each Train, once its outcome was acted on: a failure that
  // ends the job has been reported by then. Ends what Train left running
  // for the round, such as collectives still pending that must be aborted:
  // aborted before the report, they would let the peers take the round as
  // lost and re-form it before the job learns of the failure.
  virtual void RoundEnded() {}
};

// Joins the job and calls `trainer` round after round until it succeeds,
// then reports success; on a failure that cannot be recovered (or after
// max_recoveries), reports it with the error and returns it. Blocks.
// INVALID_ARGUMENT for bad options; the coordinator's errors (e.g.
// UNAUTHENTICATED) as they come.
absl::Status RunJob(const JobOptions& options, Trainer* trainer);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_RUN_JOB_H_
