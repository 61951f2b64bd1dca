// Rendezvous: worker processes join a job; a round closes when enough nodes
// have joined; every member then gets its ranks and the negotiated backend.
//
// A job's life in rounds is the RoundPhase of server/round_lifecycle.h,
// which this manager alone writes: forming round N+1 --(max nodes, or min
// nodes + last call)--> round N+1 running --(a member lost or rejoins, or a
// new incarnation on a member's node)--> round N+1 superseded, forming round
// N+2 ... Joiners that arrive while a round is running wait as spares for the
// next round, unless the round has fewer than max nodes: then a joiner
// completing a node asks the round to re-form, so the next round admits that
// node (grow). The other managers follow the rounds as RoundListeners.
// Time-based transitions (last call, join timeout) happen in Poll(), so
// tests drive them with a FakeClock.
#ifndef GRADSYNC_SERVER_RENDEZVOUS_MANAGER_H_
#define GRADSYNC_SERVER_RENDEZVOUS_MANAGER_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "server/job_manager.h"
#include "server/pending_joins.h"
#include "server/round_lifecycle.h"
#include "server/round_placement.h"

namespace gradsync {

// Implemented in rendezvous_manager.cc (joins, closing and superseding
// rounds), rendezvous_phase.cc (the phase, the round events and their
// delivery, a job's end), rendezvous_reform.cc (heals and rebalances),
// rendezvous_restore.cc (a restart on durable
// state) and rendezvous_views.cc (who waits, for status and metrics); a
// join's checks are server/join_request.h, the placement decisions
// server/round_placement.h.
//
// Thread-safe. Lock order: delivery before the state lock; holds the state
// lock while calling JobManager, which never calls back. Join callbacks and
// the listeners always run without the state lock held; the listeners get
// every round event before the answers of the call that caused it (the
// ordering contract in round_lifecycle.h). `jobs`, `clock` and the listeners
// must outlive it.
class RendezvousManager {
 public:
  // How long a round re-forming after a supersede waits for nodes of the old
  // round that have neither rejoined nor been found lost, at least (the
  // job's last call applies when longer), before it closes without them.
  static constexpr absl::Duration kAwaitedGrace = absl::Seconds(10);

  // Called exactly once with the outcome of a Join.
  using JoinCallback = std::function<void(absl::StatusOr<v1::Assignment>)>;

  // `listeners` are told about every round event, in this order.
  RendezvousManager(JobManager* jobs, Clock* clock,
                    std::vector<RoundListener*> listeners = {});

  // After a restart on durable state: rebuilds the rendezvous of every job
  // that has not ended from its record (JobManager), so that its rounds keep
  // their numbers, a member whose join answer was lost gets it again, a lost
  // member or a rejoin supersedes the running round, and a superseded round
  // re-forms awaiting the nodes of the old round that were not lost. A round
  // recorded with a lost member but not yet superseded is superseded now.
  // Processes that were waiting to join are not restored: their joins are
  // retried and wait again. DATA_LOSS for a record that cannot describe its
  // round. Call before serving.
  absl::Status Restore();

  // Starts a join (see rendezvous.proto for the semantics). `done` runs with
  // the assignment once the round closes, or with an error: at once for bad
  // input, DEADLINE_EXCEEDED after the job's join timeout, ABORTED when a
  // newer join of the same process replaces this one, CANCELLED on CancelJoin
  // or Leave. `done` may run before Join returns. Returns a ticket for
  // CancelJoin (0 when `done` already ran).
  uint64_t Join(const v1::JoinRequest& request, JoinCallback done);

  // Called exactly once with the outcome of a JoinNode: every process's
  // assignment, in the order of the request, or the first error.
  using NodeJoinCallback =
      std::function<void(absl::StatusOr<std::vector<v1::Assignment>>)>;
  // Joins every process of one node (see rendezvous.proto): each joins as
  // with Join; `done` runs once all are placed, or with the first error (the
  // others are then withdrawn). Returns the processes' tickets for
  // CancelJoin (empty when `done` already ran with an error).
  std::vector<uint64_t> JoinNode(const v1::JoinNodeRequest& request,
                                 NodeJoinCallback done);

  // Withdraws a pending join (the caller went away); a no-op when it already
  // finished.
  void CancelJoin(uint64_t ticket);

  // Failure detection lost rank `rank` of round `round` of `job_id` (its
  // heartbeats stopped or its stream broke) and the job's policy is RECOVER:
  // supersedes the round if it still runs, and stops waiting for that
  // member's node in the round that replaces it, so the survivors re-form
  // without it. A no-op when `round` is no longer the job's latest.
  // `detection` is how long the member was silent before it was found lost
  // (recorded with the recovery).
  void MemberLost(const std::string& job_id, int64_t round, int rank,
                  const std::string& reason,
                  absl::Duration detection = absl::ZeroDuration());

  // The replicas of ranks `ranks` of round `round` of `job_id` diverged from
  // the majority's (failure detection, divergence policy HEAL): supersedes
  // the round if it still runs, recording `reason` as the recovery's cause;
  // every member rejoins, and the next round copies its state from a
  // process that was not one of those ranks (unless none with state came
  // back: then the most advanced, as always). A no-op when `round` is no
  // longer the job's running one.
  void HealDivergence(const std::string& job_id, int64_t round,
                      const std::vector<int>& ranks, const std::string& reason);

  // The micro-batches of round `round` of `job_id` should move between its
  // ranks (failure detection, straggler policy REBALANCE): asks the members
  // to re-form at a step boundary, as for a node that waits to join, and
  // the next round with the same processes in the same places gives each
  // rank its share (Assignment.micro_batch_shares; `shares` by rank of
  // `round`). Shares stay with their processes' places while later rounds
  // have the same members, and are dropped when the membership changes
  // (an even division again). A no-op unless `round` runs undisturbed
  // (kRunning) and `shares` has one entry per rank.
  void Rebalance(const std::string& job_id, int64_t round,
                 const std::vector<int>& shares, const std::string& reason);

  // Removes the waiting or spare process `incarnation_id` from `job_id`.
  // INVALID_ARGUMENT for a malformed id; NOT_FOUND when no such process is
  // waiting.
  absl::Status Leave(const std::string& job_id,
                     const std::string& incarnation_id);

  // The job ended (SUCCEEDED or FAILED, for `reason`): joins waiting for
  // its next round (spares) fail with FAILED_PRECONDITION saying so, and
  // the listeners are told (RoundEvent::kJobEnded).
  void JobEnded(const std::string& job_id, v1::JobState state,
                const std::string& reason);

  // Drops everything about `job_id` (the job ended and was forgotten after
  // its retention period): waiting joins fail with FAILED_PRECONDITION, and
  // the listeners drop theirs (RoundEvent::kForgotten, told also when this
  // manager held nothing of the job).
  void ForgetJob(const std::string& job_id);

  // Counts the processes waiting for a round to form, and the spares
  // waiting while a round runs, over all jobs.
  std::pair<int64_t, int64_t> CountPending() const;

  // Closes rounds whose last call has passed and fails joins whose timeout
  // has passed. Called periodically (and by tests after stepping the clock).
  void Poll();

  // The phase of `job_id`'s rendezvous; nullopt for a job it holds nothing
  // of.
  std::optional<RoundPhase> PhaseOf(const std::string& job_id) const;

  // Adds the job's waiting processes (forming round) or spares (while a
  // round runs) to `status`. A no-op for jobs without waiting processes.
  void DescribeWaiting(const std::string& job_id, v1::JobStatus* status) const;

 private:
  // A member of the latest closed round.
  struct Member {
    v1::NodeDescriptor node;
    v1::Assignment assignment;
    absl::Time joined;
  };
  struct JobRendezvous {
    JobRendezvous(RoundPhase initial, v1::JobConfig config_in)
        : config(std::move(config_in)),
          phase(initial),
          pending(config.nproc_per_node()) {}
    v1::JobConfig config;
    int64_t round = 0;  // latest closed round; 0 before the first closes
    // Written by SetPhaseLocked only. While `round` runs, joiners are
    // spares; otherwise they form round + 1.
    RoundPhase phase;
    std::vector<Member> members;  // of `round`, in rank order
    absl::flat_hash_map<std::string, size_t> member_by_incarnation;
    absl::flat_hash_map<std::string, int> node_rank_by_node;  // of `round`
    // Nodes of the round superseded last; they take places in the forming
    // round before spares do.
    absl::flat_hash_set<std::string> previous_round_nodes;
    // Of those, the nodes not known lost: once all of them are back (and
    // min nodes are there), the forming round closes without a last call.
    absl::flat_hash_set<std::string> awaited_nodes;
    // Node id of each rank of `round`, kept after it is superseded so that a
    // loss reported late still names the node.
    std::vector<std::string> node_of_rank;
    // Set when `round` is superseded; completed and recorded when the next
    // round closes.
    std::optional<v1::Recovery> recovery;
    // Whether `recovery`'s cause is only that a survivor rejoined: a member
    // of the round found lost before the next round closes (most often the
    // one whose failure made the survivors rejoin) becomes the cause.
    bool cause_is_rejoin = false;
    // Whether `round` was superseded only for a planned re-form (its members
    // stopped at a step boundary to admit a node) and none of its members
    // was found lost since; the next round's assignments say so
    // (Assignment.follows_planned_reform).
    bool reform_as_planned = false;
    // Incarnations whose replica diverged (HealDivergence): the next round
    // does not take its state from them. Cleared when it closes.
    absl::flat_hash_set<std::string> distrusted_sources;
    // In kReformRequested: why the members were asked to re-form at a step
    // boundary (a node waits to join, or a rebalance); empty otherwise.
    std::string reform_reason;
    // The micro-batch shares of the latest Rebalance, by (node id, local
    // rank): given to every round whose places are exactly these, dropped
    // at the first round whose places differ.
    std::map<std::pair<std::string, int>, int> shares_by_place;
    // The processes waiting for the next round (spares while one runs).
    PendingJoins pending;
    // Set while the phase is kLastCall.
    std::optional<absl::Time> last_call_deadline;
    // node id -> node rank it held last, so a returning node gets it back.
    absl::flat_hash_map<std::string, int> remembered_node_rank;
  };
  using Completion = std::pair<JoinCallback, absl::StatusOr<v1::Assignment>>;
  class NodeJoin;

  // Checks the joins of `processes` (one, or one node's) and finds or
  // creates their job: its config, or the error to answer with.
  absl::StatusOr<v1::JobConfig> AdmitJoin(
      const std::vector<v1::JoinRequest>& processes) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves `job` to phase `to` (a transition RoundPhaseMayBecome allows):
  // the one place a phase changes.
  void SetPhaseLocked(JobRendezvous* job, RoundPhase to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The micro-batch shares of a round placed as `placement`, by rank: the
  // latest Rebalance's when its places are exactly the round's; otherwise
  // none (and they are forgotten).
  std::vector<int> SharesForLocked(JobRendezvous* job,
                                   const Placement& placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rendezvous of `job_id`; null when it has none.
  JobRendezvous* FindLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `event` for the listeners (Finish delivers it).
  void AddEventLocked(RoundEvent::Kind kind, const JobRendezvous& job,
                      const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the last-call deadline of `job`, if one is set (the caller moves
  // the phase on).
  void CancelLastCallLocked(JobRendezvous* job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rendezvous of the job `config` describes, made on first use.
  JobRendezvous* JobFor(const v1::JobConfig& config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Rebuilds `job` from its `record` (see Restore).
  absl::Status RestoreLocked(const v1::JobStatus& record, JobRendezvous* job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a validated joiner to `job`, superseding or answering as needed.
  void JoinLocked(JobRendezvous* job, const v1::JoinRequest& request,
                  JoinCallback done, uint64_t* ticket,
                  std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A join while `job`'s round runs: a member's rejoin repeats a lost
  // answer (true: answered, `done` taken) or supersedes the round (planned
  // when a re-form was requested); a new process on a node of the round
  // supersedes it too. False: the join goes on to wait.
  bool JoinOfTheRunningRoundLocked(JobRendezvous* job,
                                   const v1::JoinRequest& request,
                                   const v1::NodeDescriptor& node,
                                   JoinCallback* done,
                                   std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before `node`'s process waits: its own earlier join, or the oldest
  // waiting process of a node that already has nproc_per_node, is replaced
  // (ABORTED).
  void ReplaceWaitingLocked(JobRendezvous* job, const v1::NodeDescriptor& node,
                            std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the running round because of `reason`; its members must rejoin.
  void SupersedeLocked(JobRendezvous* job, const std::string& reason,
                       absl::Duration detection = absl::ZeroDuration())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the forming round now if it may: every awaited node of a
  // superseded round back and max nodes reached, or min nodes in a
  // re-forming round; or min nodes and the last call passed (or zero;
  // kAwaitedGrace at least while awaited nodes are missing). Starts the last
  // call when min nodes first complete.
  void MaybeCloseLocked(JobRendezvous* job, std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the forming round: places the waiting processes (PlaceRound),
  // records the round, then opens it; refuses the chosen joins when it
  // cannot be recorded.
  void CloseLocked(JobRendezvous* job, std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The chosen processes of a round being closed: [i][local] is the process
  // of local rank `local` on the i-th node of the placement.
  using ChosenProcesses = std::vector<std::vector<PendingJoins::Iterator>>;
  // Records the round `placement` closes with `chosen` (JobManager).
  absl::Status RecordCloseLocked(const JobRendezvous& job,
                                 const Placement& placement,
                                 const ChosenProcesses& chosen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refuses the `chosen` joins (UNAVAILABLE: they retry) because round
  // `round` could not be recorded (`recorded`); nothing else changes.
  void RefuseCloseLocked(JobRendezvous* job, int64_t round,
                         const ChosenProcesses& chosen,
                         const absl::Status& recorded,
                         std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the recorded round `job`'s running one and answers `chosen`
  // with their assignments (after the kClosed event: Finish).
  void OpenRoundLocked(JobRendezvous* job, const Placement& placement,
                       const ChosenProcesses& chosen,
                       std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When `node_id` just became a complete node and the running round has
  // fewer than max_nodes: asks the round's members to re-form at their next
  // step boundary (RoundEvent::kReformRequested); the first of them to
  // rejoin supersedes the round, and the next one admits the new node.
  void MaybeGrowLocked(JobRendezvous* job, const std::string& node_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every awaited node of the superseded round is complete again.
  bool AwaitedBackLocked(const JobRendezvous& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every pending joiner of `job` with `status` and cancels its last
  // call.
  void FailPendingLocked(JobRendezvous* job, const absl::Status& status,
                         std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a pending joiner, returning its callback.
  JoinCallback RemovePendingLocked(JobRendezvous* job,
                                   PendingJoins::Iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string TimeoutMessageLocked(const JobRendezvous& job,
                                   const Joiner& joiner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Delivers every queued round event to the listeners, then answers
  // `completions` (the ordering contract of round_lifecycle.h: a caller that
  // finds the queue taken by another thread waits until that thread has
  // delivered it).
  void Finish(std::vector<Completion> completions)
      ABSL_LOCKS_EXCLUDED(mu_, deliver_mu_);

  JobManager* const jobs_;
  Clock* const clock_;
  const std::vector<RoundListener*> listeners_;

  // Held while round events are delivered, so that they reach the listeners
  // in the order they happened.
  absl::Mutex deliver_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<JobRendezvous>> rendezvous_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // ticket -> job id, for CancelJoin.
  absl::flat_hash_map<uint64_t, std::string> ticket_job_ ABSL_GUARDED_BY(mu_);
  // (join deadline, ticket), earliest first.
  std::set<std::pair<absl::Time, uint64_t>> join_deadlines_
      ABSL_GUARDED_BY(mu_);
  // (last-call deadline, job id), earliest first.
  std::set<std::pair<absl::Time, std::string>> last_calls_
      ABSL_GUARDED_BY(mu_);
  // Round events not yet delivered (Finish), in order.
  std::vector<RoundEvent> round_events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_RENDEZVOUS_MANAGER_H_
