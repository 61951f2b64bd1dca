// In-place recovery: a worker process's life across rounds. When a peer is
// lost, the survivors do not exit: each tears its process group down,
// rejoins the job with the steps it has committed, gets a new assignment
// (same world size with a spare, fewer ranks without), rebuilds the process
// group through the new round's key-value store, and trains on from the most
// advanced member's state, which the round's source rank sends to the
// others. No LibTorch here: the training loop plugs in as a RoundTrainer.
#ifndef GRADSYNC_WORKER_RUNTIME_ELASTIC_H_
#define GRADSYNC_WORKER_RUNTIME_ELASTIC_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "worker/backend/backend.h"
#include "worker/client/coordinator_client.h"
#include "worker/runtime/health_reporter.h"
#include "worker/runtime/process_group.h"

namespace gradsync {

// A training loop that keeps its state across rounds (see TrainingRun for
// gradsync's own). Used by one thread.
class RoundTrainer {
 public:
  virtual ~RoundTrainer() = default;
  // Whether the process holds training state (it trained in a round), and
  // the optimizer steps it has committed: sent with every rejoin, so the
  // coordinator can name the new round's source rank.
  virtual bool has_state() const = 0;
  virtual int64_t committed_step() const = 0;
  // Trains in the round `assignment` describes, over `backend` (which took
  // `process_group_time` to build), until training is done (OK) or a
  // failure. Starts by copying the state of rank assignment.source_rank
  // (collective). After a failure the trainer must hold the state of its
  // last committed step. When assignment.may_grow, the trainer should stop
  // at a step boundary once the coordinator asks (the reporter's
  // Verdict::reform_at_step_boundary), all members after the same step, and
  // return ReformAtStepBoundary (reform.h).
  virtual absl::Status TrainRound(const v1::Assignment& assignment,
                                  Backend* backend,
                                  absl::Duration process_group_time) = 0;
};

struct ElasticOptions {
  ProcessGroupOptions process_group;
  // How often this process may re-form its round after a failure before it
  // gives up.
  int max_recoveries = 3;
  // Called after every join with the new assignment (e.g. to print it, or
  // to check it fits the process), once the reporter heartbeats for its
  // round; an error ends RunElastic with it (reported for that round).
  std::function<absl::Status(const v1::Assignment&)> on_assignment;
  // The process keeps its first round's local rank (JoinRequest.local_slot
  // in every rejoin): set for a process on a GPU, whose device follows it.
  bool keep_local_rank = false;
  // The first round's assignment when it arrived already (gradsync launch
  // joined for this process, launched_process.h): used instead of the first
  // join.
  std::optional<v1::Assignment> first_assignment;
};

// Whether a failed round can be fixed by re-forming it: a peer was lost or
// stopped answering (UNAVAILABLE, DEADLINE_EXCEEDED), or the round was
// superseded or its collectives aborted (ABORTED, CANCELLED).
bool RecoverableByRejoining(const absl::Status& status);

// Joins with `request` (its has_state, committed_step and last_round are
// filled in for every rejoin), then round after round builds the process
// group and calls `trainer`. When the coordinator ends the member while it
// trains (the round was superseded because a peer was lost or hung, or the
// job failed), the process group is aborted from the reporter's thread, so
// a collective blocked on a hung peer fails at once instead of at the
// backend's timeout. A round the trainer ends at a step boundary because
// the coordinator asked it to re-form (IsReformAtStepBoundary) is rejoined
// at once and is not a recovery; when this rank's agreement to stop failed
// (IsReformVoteFailed), it is one unless the next round follows the planned
// re-form (Assignment.follows_planned_reform). On a recoverable failure under the job's
// RECOVER policy it tears the process group down and rejoins, at most
// `options.max_recoveries` times. Heartbeats go through `reporter`, restarted
// for every round. Returns OK once training finished and the success was
// reported (reporter->Finish; a round superseded just then is rejoined, and
// training finishes in the next one); otherwise the error that ended it (the
// caller reports the failure): the trainer's or the
// coordinator's own (a non-recoverable error, or any error under the FAIL
// policy), or FAILED_PRECONDITION naming the last error once
// max_recoveries are used up. `client`, `reporter` and `trainer` must stay
// valid during the call.
absl::Status RunElastic(CoordinatorClient* client, v1::JoinRequest request,
                        const ElasticOptions& options,
                        HealthReporter* reporter, RoundTrainer* trainer);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_ELASTIC_H_
