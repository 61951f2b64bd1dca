// Failure detection and diagnosis for running rounds: ingests worker
// heartbeats (Monitor.Heartbeat), marks members LOST when they miss heartbeats
// or their stream breaks, moves jobs to DEGRADED, FAILED or SUCCEEDED, and
// diagnoses hangs, desyncs and stragglers from what workers report.
//
// A round is monitored from the first heartbeat or completion report of any
// of its members (jobs whose workers never heartbeat are never marked LOST),
// or, after a restart on durable state, from MonitorRunningRounds(). From
// then on every member must heartbeat; one silent for
// missed_heartbeats x heartbeat_interval (counted from its last heartbeat, or
// for one not heard yet from the latest first heartbeat of another, up to
// shedding.max_factor such windows from the start of monitoring) is LOST.
// Time comes from the injected Clock and detection runs in Poll(), so tests
// step a FakeClock.
//
// Past its heartbeat capacity the coordinator sheds load instead of
// declaring live members LOST (HeartbeatShedder decides when and how much;
// see there for the signal: heartbeats handled late). While it sheds:
//  - every heartbeat answer carries the slowed interval (the job's interval
//    x factor): each member's next heartbeat is answered when the factor
//    changed since it was last told, and the workers' reporters send at the
//    interval they were last told (back at the job's once told so);
//  - a member is LOST after missed_heartbeats x its interval x the larger of
//    the factor now and the factor it was last told (the older one until
//    its first heartbeat after being told: it may still be on it), plus,
//    while the coordinator is behind, the backlog it knows it has (the time
//    it has been behind, or the longest its queues held heartbeats; at most
//    missed x interval x max_factor): so at most 2 x missed x interval x
//    max_factor after its last heartbeat was handled. The allowance covers
//    the onset too, before any member was told to slow down. A job whose
//    own heartbeats keep time while the coordinator is behind (none late
//    since it began, at most one member overdue, one on time:
//    KeepsTimeLocked) is given only what the delay of a member's queue
//    (the completion queue serving its stream), and under a heartbeat cap
//    its job's wait for turns, grew by since its last heartbeat was
//    handled: its silent member is not starved, so a flood in another job
//    does not slow finding it. (A member starved alone, on
//    a connection the others of its job do not share, is then taken for
//    stopped.)
//  - Describe() reports it in the diagnosis (JobDiagnosis.overload), and
//    shedding() gives the state for metrics.
// Heartbeats already queued in a connection when a member stops are still
// read, and count, before its silence does.
//
// A broken heartbeat stream (a killed process, or a connection reset, proxy
// restart or keepalive timeout) starts the member's reconnect grace
// (HealthConfig::reconnect_grace; the job's missed-heartbeat window by
// default, stretched by the shedding factor like the silence limit): a
// heartbeat on a new stream within it keeps the member's place, silently;
// past it the member is LOST. The silence limit does not apply meanwhile.
// A stream that breaks after a newer one of the same member heartbeated
// changes nothing. When the round is superseded (its survivors rejoined,
// most often because a collective with the broken member failed), members
// in their grace are reported lost at once, so the round that replaces it
// does not wait for them.
//
// Implemented in health_manager.cc (monitoring, heartbeat ingest,
// completion, transitions), health_detection.cc (broken streams, Poll:
// silence, hangs), health_replicas.cc (divergences, rebalances) and
// health_views.cc (status, the page, Prometheus); wire checks: health_wire.h.
//
// Hot path: a heartbeat takes one per-job lock and swaps the reported metrics
// into the member's slot (no allocation in steady state); low-rate state
// changes are recorded in JobManager.
#ifndef GRADSYNC_SERVER_HEALTH_MANAGER_H_
#define GRADSYNC_SERVER_HEALTH_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/self_set_timeout.h"
#include "proto/gradsync/v1/health.pb.h"
#include "server/hang_stack_request.h"
#include "server/health_config.h"
#include "server/health_detectors.h"
#include "server/heartbeat_shedder.h"
#include "server/share_balancer.h"
#include "server/job_manager.h"
#include "server/member_sample.h"
#include "server/queue_delays.h"
#include "server/round_lifecycle.h"

namespace gradsync {

class HealthManager : public RoundListener {
 public:
  // A member failure detection lost in a job whose policy is RECOVER.
  struct Loss {
    std::string job_id;
    int64_t round = 0;
    int rank = 0;
    std::string reason;  // "rank 2 (host) lost: heartbeat stream broke ..."
    // How long the member had been silent when it was found lost; zero
    // when its stream broke and its round was already re-forming (or there
    // is no reconnect grace).
    absl::Duration detection;
  };
  // Told about every such loss, without any of the manager's locks held;
  // the composition root points it at the rendezvous, which re-forms the
  // round. Also called for a member whose stream breaks after its round was
  // superseded (the survivors re-forming need not wait for it).
  using LossCallback = std::function<void(const Loss&)>;
  // Told when a job ends (SUCCEEDED or FAILED) with the job's reason, so
  // processes still waiting to join it can be turned away. Runs without
  // this manager's locks held, before the call that ended the job returns
  // (Heartbeat, StreamBroken, ReportCompletion, Poll).
  using JobEndedCallback =
      std::function<void(const std::string& job_id, v1::JobState state,
                         const std::string& reason)>;
  // A round whose replicas diverged, with a majority, in a job whose
  // divergence policy is HEAL: the composition root points it at the
  // rendezvous, which supersedes the round and re-forms it with its state
  // copied from a rank not in `ranks`. Called like JobEndedCallback.
  struct Heal {
    std::string job_id;
    int64_t round = 0;
    std::vector<int> ranks;  // the diverged ones
    std::string reason;      // the divergence's verdict
  };
  using HealCallback = std::function<void(const Heal&)>;
  // A round whose ranks run an exact global batch, with a straggler, in a
  // job whose straggler policy is REBALANCE, and shares that shorten its
  // step (ShareBalancer): the composition root points it at the
  // rendezvous, which re-forms the round at a step boundary with them.
  // Called like JobEndedCallback, at most once per round.
  struct Rebalance {
    std::string job_id;
    int64_t round = 0;
    std::vector<int> shares;  // by rank
    std::string reason;       // the proposal's verdict
  };
  using RebalanceCallback = std::function<void(const Rebalance&)>;

  // What one heartbeat stream remembers between messages so that the next
  // heartbeat of the same member skips the lookups. Owned by the stream;
  // used by one thread at a time.
  class Session;

  // `jobs` and `clock` must outlive it. The callbacks may be empty.
  HealthManager(JobManager* jobs, Clock* clock, HealthConfig config,
                LossCallback on_loss = nullptr,
                JobEndedCallback on_job_ended = nullptr,
                HealCallback on_heal = nullptr,
                RebalanceCallback on_rebalance = nullptr);
  ~HealthManager() override;

  // Creates the state of one heartbeat stream, served by completion queue
  // `queue` (-1: not known; see ReportQueueDelay).
  static std::unique_ptr<Session> NewSession(int queue = -1);

  // Records one heartbeat of `session`'s stream. Takes the metrics out of
  // `request` (swapped, so the caller's message keeps its capacity). Fills
  // `response` and returns true when the worker should be told the job's
  // state: on the stream's first heartbeat and whenever the job's state or
  // reason changed since. Errors (the stream should end with them):
  // INVALID_ARGUMENT, NOT_FOUND, ABORTED (round over), FAILED_PRECONDITION
  // (not a member). Thread-safe across sessions.
  absl::StatusOr<bool> Heartbeat(Session* session, v1::HeartbeatRequest* request,
                                 v1::HeartbeatResponse* response);

  // The stream of `session` broke (cancelled, connection reset): its member
  // starts its reconnect grace (LOST at once without one), unless it already
  // exited, heartbeats on a newer stream, or detection is stopped. A member
  // only taken for stopped by the job's failure is LOST then (its record is
  // corrected after the job's end).
  void StreamBroken(Session* session);

  // Records a member's completion; returns the job's state after it.
  absl::StatusOr<v1::JobState> ReportCompletion(
      const v1::ReportCompletionRequest& request);
  // Records completions, with one write per job for those of its members
  // (a job of N members ending makes N/batch writes, not N): each answer as
  // ReportCompletion's for its request, by index. A request repeated in the
  // batch (a retry) is answered as the first.
  std::vector<absl::StatusOr<v1::JobState>> ReportCompletions(
      const std::vector<const v1::ReportCompletionRequest*>& requests);

  // Ends the monitoring of superseded rounds, marks silent members LOST and
  // diagnoses hangs. Called every poll interval. The jobs' state is not
  // polled: the rendezvous reports superseded rounds (RoundEnded), and this
  // manager records every other transition of a monitored round itself.
  void Poll();

  // After a restart on durable state: starts monitoring every running round
  // at once, members as recorded. No member is found silent for
  // kRestartGrace detection windows from the restart (15 s with the
  // defaults): members reconnect, and those still bootstrapping through the
  // key-value store finish the calls the outage delayed, before their first
  // heartbeat; on this project's test machines a client's reconnection has
  // been seen to take up to 5 s. A member silent past that is LOST, so a
  // round whose workers died during the outage does not look healthy
  // forever. Call once serving.
  void MonitorRunningRounds();
  static constexpr int kRestartGrace = 5;

  // Follows the rendezvous: kSuperseded -> RoundEnded, kReformRequested ->
  // ReformRequested, kForgotten -> Forget.
  void OnRoundEvent(const RoundEvent& event) override;

  // The rendezvous superseded round `round` of `job_id`: from now on its
  // members' heartbeats and completion reports are ABORTED (they rejoin),
  // without waiting for the next Poll. Takes no job lock.
  void RoundEnded(const std::string& job_id, int64_t round);

  // The rendezvous asks the members of round `round` of `job_id` to re-form
  // at their next step boundary (a node waits to join): from now on every
  // heartbeat answer of that round says so (reform_at_step_boundary), also
  // when its monitoring starts later. Called without the rendezvous's lock.
  void ReformRequested(const std::string& job_id, int64_t round);

  // Stops marking members LOST for broken streams (the server is shutting
  // down and cancels every stream). Irreversible.
  void StopDetection() { stopped_.store(true); }

  // Adds what monitoring knows to `status` (read from JobManager): each
  // member's metrics (with their per-bucket stats if `with_buckets`), last
  // heartbeat and lag, and the job's diagnosis. Only the job's latest
  // divergence and rebalance when the status's round is not monitored (yet).
  void Describe(v1::JobStatus* status, bool with_buckets = false) const;
  // Fills status->summary with what monitoring knows of every member of the
  // status's round, whichever members `status` lists: members heard from,
  // least and most steps, stragglers and the slowest ranks. A no-op when
  // the round is not monitored.
  void Summarize(v1::JobStatus* status) const;
  // The ranks flagged as stragglers in the monitored round of `job_id`, and
  // that round (0 and none when the job is not monitored).
  std::pair<int64_t, std::vector<int>> StragglerRanks(
      const std::string& job_id) const;

  // Calls `fn` for every member of every monitored round, under that job's
  // lock (fn must not call back into the manager).
  void ForEachMember(const std::function<void(const MemberSample&)>& fn) const;

  // Heartbeats accepted since start.
  int64_t heartbeats() const { return heartbeats_.load(); }
  // Replica divergences found since start (DivergenceDetector).
  int64_t divergences() const { return divergences_.load(); }

  // How late the coordinator runs what arrives now (the oldest event waiting
  // in its completion queues, or for its turn under a rate cap): the largest
  // `delay` and each queue's (`per_queue`, indexed as NewSession's `queue`),
  // and under a cap each job's wait for turns (HeartbeatPacer; jobs left
  // out wait for none), reported before each Poll(). An overload shows in
  // it at once.
  void ReportQueueDelay(
      absl::Duration delay, absl::Span<const absl::Duration> per_queue = {},
      absl::flat_hash_map<std::string, absl::Duration> turn_waits = {});

  // Whether and how much the coordinator sheds heartbeat load now.
  HeartbeatShedder::State shedding() const { return shedder_.state(); }
  // How much longer than usual a member may be silent now, while the
  // coordinator is behind (HeartbeatShedder::Allowance; each job caps it).
  absl::Duration allowance() const {
    return shedder_.Allowance(clock_->Now());
  }
  // The coordinator's default heartbeat interval (jobs may set their own).
  absl::Duration default_interval() const { return config_.heartbeat_interval; }

  // Drops everything about `job_id` (it was forgotten after retention).
  void Forget(const std::string& job_id);

 private:
  // Why a member whose heartbeat stream broke is, or may become, LOST.
  static constexpr char kStreamBroke[] =
      "heartbeat stream broke (process killed or connection lost)";

  struct MemberHealth {
    std::string incarnation_id;
    std::string host;
    v1::MemberState state = v1::MEMBER_STATE_ACTIVE;
    bool heard = false;
    absl::Time last_seen;  // last heartbeat, or the start of monitoring
    // The queue that heartbeat came through (Session::queue), and its delay
    // plus the job's turn_wait (ReportQueueDelay) when it was handled.
    int queue = -1;
    absl::Duration seen_delay;
    int64_t last_started = 0;
    int64_t last_finished = 0;
    v1::WorkerMetrics metrics;  // latest snapshot, events and buckets cleared
    // The snapshot's buckets, kept apart: status leaves them out by default.
    google::protobuf::RepeatedPtrField<v1::BucketStats> buckets;
    bool succeeded = false;            // reported success
    bool round_start_seen = false;     // its RoundStartTimings recorded
    // The shedding factor the member was last told (1: the job's interval),
    // and the one its next heartbeat is judged by: the larger of the last
    // two told until its first heartbeat after being told (it may still
    // have been waiting on the older interval), then the last told.
    int told_factor = 1;
    int allowed_factor = 1;
    // Session::id of the stream it last heartbeated on (0: none yet).
    uint64_t stream = 0;
    // When that stream broke (InfiniteFuture: it is fine; see reconnect_grace).
    absl::Time stream_broke = absl::InfiniteFuture();
    // EXITED by the job's failure without a word of its own (see
    // AddStoppedMembers) and not heard of since; recorded LOST after the
    // job's end for its broken stream (LostAfterTheEnd).
    bool presumed_stopped = false;
    bool lost_after_end = false;
  };
  // The monitoring of one round of one job.
  struct JobHealth {
    absl::Mutex mu;
    // Set at creation, then constant.
    std::string job_id;
    int64_t round = 0;
    absl::Duration interval;
    int missed = 0;
    v1::FailurePolicy policy = v1::FAILURE_POLICY_DEGRADE;
    absl::Duration straggler_threshold;
    // Made with the job's fixed timeout or the coordinator's bounds.
    std::optional<SelfSetTimeout> hang_timeout ABSL_GUARDED_BY(mu);
    // How long a member whose stream broke may take to heartbeat again.
    absl::Duration reconnect_grace;
    // A heartbeat later than this x its member's factor after the member's
    // previous one is late (interval x the shedder's late_ratio).
    absl::Duration late_after;
    // What started the monitoring, for a member LOST without a heartbeat:
    // "monitoring began" or "the coordinator restarted".
    std::string started_by;
    // No member is found silent before this (the grace after a restart).
    absl::Time not_lost_before = absl::InfinitePast();
    // The latest first heartbeat of a member (see LostReasonLocked).
    absl::Time first_heard_last ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    // The job's state and reason: read from JobManager when the monitoring
    // started, then as this manager recorded them (Transition);
    // `generation` counts their changes so streams know what to resend.
    v1::JobState state ABSL_GUARDED_BY(mu) = v1::JOB_STATE_RUNNING;
    std::string reason ABSL_GUARDED_BY(mu);
    int64_t generation ABSL_GUARDED_BY(mu) = 1;
    // False once the round was superseded or forgotten (heartbeats: ABORTED).
    bool current ABSL_GUARDED_BY(mu) = true;
    // The rendezvous asked the members to re-form at a step boundary.
    bool reform_requested ABSL_GUARDED_BY(mu) = false;
    std::vector<MemberHealth> members ABSL_GUARDED_BY(mu);
    int succeeded ABSL_GUARDED_BY(mu) = 0;  // members that reported success
    // When any rank last finished a collective (or monitoring started).
    absl::Time last_progress ABSL_GUARDED_BY(mu);
    DesyncDetector desync ABSL_GUARDED_BY(mu);
    // Made with the round's world size; `heal_divergence` from the job's
    // divergence policy; `healing` once a heal was asked for (the round's
    // later fingerprints are not compared).
    std::optional<DivergenceDetector> divergence ABSL_GUARDED_BY(mu);
    bool heal_divergence = true;
    bool healing ABSL_GUARDED_BY(mu) = false;
    // Made with the round's world size and the job's threshold.
    std::optional<StragglerDetector> stragglers ABSL_GUARDED_BY(mu);
    // Made with the round's world size; `rebalance` from the job's
    // straggler policy; `rebalancing` once a rebalance was asked for.
    std::optional<ShareBalancer> balancer ABSL_GUARDED_BY(mu);
    bool rebalance = true;
    bool rebalancing ABSL_GUARDED_BY(mu) = false;
    v1::JobDiagnosis diagnosis ABSL_GUARDED_BY(mu);
    // Stacks a standing hang verdict asked for (diagnosis.hang_stacks).
    HangStackRequest hang_stacks ABSL_GUARDED_BY(mu);
    // Heartbeats counted for the shedder since the last Poll.
    HeartbeatShedder::Counts load ABSL_GUARDED_BY(mu);
    // The factor its members are asked for (HeartbeatShedder::FairFactors
    // of the shedder's, set by every Poll), and the heartbeats a second its
    // active members send at the job's own interval (as of the last Poll).
    int factor ABSL_GUARDED_BY(mu) = 1;
    double full_rate ABSL_GUARDED_BY(mu) = 0;
    // Its wait for turns under a heartbeat cap (as of the last Poll).
    absl::Duration turn_wait ABSL_GUARDED_BY(mu);
    // The coordinator's current episode of being behind as this job saw it
    // (InfinitePast: none): when it began, and the job's heartbeats since
    // that had a gap to their member's previous one, and of those the late.
    absl::Time episode ABSL_GUARDED_BY(mu) = absl::InfinitePast();
    int64_t episode_samples ABSL_GUARDED_BY(mu) = 0;
    int64_t episode_late ABSL_GUARDED_BY(mu) = 0;
    // Ranks whose stream broke, and ranks that heartbeated again in their
    // grace, since the last Poll (which logs them, one line each).
    std::vector<int> broke ABSL_GUARDED_BY(mu);
    std::vector<int> reconnected ABSL_GUARDED_BY(mu);
    // Set by RoundEnded the moment the rendezvous supersedes the round, so
    // its members are turned away at once; the next Poll clears `current`.
    std::atomic<bool> superseded{false};

    // Whether the round is still the job's running one.
    bool live() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return current && !superseded.load();
    }
    // Whether failure detection applies: the round runs and has not ended.
    bool detecting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return live() && (state == v1::JOB_STATE_RUNNING ||
                        state == v1::JOB_STATE_DEGRADED);
    }
  };

  // Finds or starts the monitoring of the session's round, checks the
  // member, and points `session` at it.
  absl::Status Resolve(Session* session, const v1::MemberRef& member);
  absl::StatusOr<std::shared_ptr<JobHealth>> FindOrStart(
      const v1::MemberRef& member,
      absl::string_view started_by = "monitoring began",
      int grace_windows = 0);
  // The monitoring of `round` (from JobManager) of `job_id`, with the job's
  // settings or the coordinator's; no member found silent for
  // `grace_windows` detection windows.
  std::shared_ptr<JobHealth> NewJobHealth(const std::string& job_id,
                                          RoundMembers round,
                                          absl::string_view started_by,
                                          int grace_windows) const;
  // Makes `job` its job's monitored round (an older one stops being
  // current); the one installed meanwhile by another thread when it has the
  // same round; ABORTED when a newer round is monitored already.
  absl::StatusOr<std::shared_ptr<JobHealth>> Install(
      std::shared_ptr<JobHealth> job) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::shared_ptr<JobHealth>> Snapshot() const;
  // The monitoring of round `round` of `job_id` (null: not monitored).
  std::shared_ptr<JobHealth> Monitored(const std::string& job_id,
                                       int64_t round) const;

  // Ingest helpers.
  void RecordCollectives(JobHealth* job, int rank,
                         const v1::WorkerMetrics& metrics)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  void RecordReadyTimes(JobHealth* job, int rank,
                        const v1::WorkerMetrics& metrics)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // After a straggler verdict: asks once for a proposed, allowed rebalance.
  void MaybeRebalance(JobHealth* job,
                      const std::vector<v1::Straggler>& stragglers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Heartbeat's work on the member's round (HandleHeartbeat), in steps:
  // notes the stream the heartbeat came on (false: a new one, whose member
  // is then out of its reconnect grace), counts it for the shedder, records
  // the collectives' progress and the round start, and fills the answer
  // (false: nothing to tell).
  bool NoteStreamLocked(JobHealth* job, const Session& session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  void CountLoadLocked(JobHealth* job, const MemberHealth& m, bool same_stream,
                       absl::Time now, int factor)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  void RecordProgressLocked(JobHealth* job, int rank,
                            const v1::WorkerMetrics& in, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  bool AnswerLocked(JobHealth* job, Session* session, int factor,
                    v1::HeartbeatResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Records member changes and a job state in JobManager, then mirrors them.
  // FAILED_PRECONDITION (nothing changed) when the round is no longer the
  // job's running one: the rendezvous superseded it before this manager's
  // next Poll noticed.
  absl::Status Transition(JobHealth* job, HealthUpdate update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Adds the job state lost members lead to, per the policy; under RECOVER
  // appends a Loss per lost member of `update` to `losses`.
  void ApplyPolicy(JobHealth* job, const std::string& what,
                   HealthUpdate* update, std::vector<Loss>* losses)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Marks silent members LOST: silent longer than missed x interval x
  // their factor (see the class comment) plus the backlog the coordinator
  // knows it has (`allowed`, capped per job; for a job that keeps time only
  // the queue delay's growth). Adds the active members heard from, those
  // overdue (silent over late_after x factor) and their rates to `backlog`.
  void PollJob(JobHealth* job, absl::Time now,
               const HeartbeatShedder::Allowances& allowed,
               std::vector<Loss>* losses, HeartbeatShedder::Backlog* backlog)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Adds `counts` (the job's heartbeats since the last Poll) to its view of
  // the episode of being behind that began at `allowed.since`, starting
  // over when a new one began, and forgetting it when none goes on.
  static void NoteEpisodeLocked(JobHealth* job,
                                const HeartbeatShedder::Allowances& allowed,
                                const HeartbeatShedder::Counts& counts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Whether the job's own heartbeats keep time while the coordinator is
  // behind (its silent members are stopped, not starved; see Silence): none
  // since the episode began was late (at least one judged), at least one
  // active member is on time, at most one overdue (several at once may be
  // a connection or a node starved). If not, sets `why_not` (if given).
  static bool KeepsTimeLocked(const JobHealth& job, absl::Time now,
                              std::string* why_not = nullptr)
      ABSL_SHARED_LOCKS_REQUIRED(job.mu);
  // How long a member may be silent in one Poll (see PollJob).
  struct Silence {
    absl::Duration limit;  // missed x interval, at factor 1
    absl::Duration extra;  // the coordinator's known backlog, capped
    absl::Duration quiet;  // below this a member is neither overdue nor lost
    // The job keeps time (KeepsTimeLocked): a member is allowed only what
    // its queue's delay and the job's turn_wait grew by since its last
    // heartbeat was handled (from its seen_delay to `delays`' now plus
    // `turn_wait`, at most `extra`), not all of `extra`.
    bool kept_time = false;
    const QueueDelays* delays = nullptr;
    absl::Duration turn_wait;
    absl::Duration Extra(const MemberHealth& m) const;
  };
  // Why active member `m` is LOST now (nullopt: it is not): its reconnect
  // grace passed, or it was silent past `silence` at its factor (and what
  // of the backlog it was allowed). Counts it in `backlog` if overdue.
  std::optional<std::string> LostReasonLocked(
      const JobHealth& job, const MemberHealth& m, const Silence& silence,
      absl::Time now, int factor, HeartbeatShedder::Backlog* backlog) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
  // Records the members of `update` LOST (per the policy; losses appended
  // under RECOVER, with how long each was silent).
  void RecordLossesLocked(JobHealth* job, HealthUpdate update, absl::Time now,
                          std::vector<Loss>* losses)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // JobDiagnosis.overload for a job with `interval` whose members are asked
  // for `factor`, from the shedder's state; empty when the coordinator
  // keeps up, or sheds load from other jobs only.
  std::string OverloadText(const HeartbeatShedder::State& state, int factor,
                           absl::Duration interval, int missed) const;
  // When the job ends: its members still in their reconnect grace are
  // LOST (no round is left to reconnect to); the reason names them.
  void AddBrokenStreams(JobHealth* job, HealthUpdate* update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // When the job fails: its members still ACTIVE (not changed by `update`)
  // are EXITED, "stopped: the job failed", so that no member stays active
  // in a failed job (their processes are being stopped; a report that
  // comes later changes nothing). Returns their ranks. The one exception
  // is a broken stream: see LostAfterTheEnd.
  std::vector<int> AddStoppedMembers(JobHealth* job, HealthUpdate* update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // A member taken for stopped by the job's failure whose heartbeat stream
  // then broke (no half-close): it was lost, most often the very cause of
  // the failure, killed before the coordinator saw its stream break. Its
  // record says LOST, until it reports its completion after all (a
  // connection reset while its process stopped): then that.
  void LostAfterTheEnd(JobHealth* job, int rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Records `rank` `state` after the job ended (JobManager::RecordAfterEnd)
  // and sets it here; false (logged) when the record failed.
  bool RecordAfterTheEnd(JobHealth* job, int rank, v1::MemberState state,
                         const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // A superseded round's members whose stream broke, as losses (the round
  // replacing it need not wait for them).
  void ReportBrokenStreams(JobHealth* job, std::vector<Loss>* losses)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Tells on_loss_ about `losses`; no lock held.
  void ReportLosses(const std::vector<Loss>& losses);
  // Tells on_job_ended_ about the job ends Transition queued, and on_heal_
  // about the heals RecordFingerprints queued, and keeps the divergences it
  // found; no job lock held.
  void ReportQueued() ABSL_LOCKS_EXCLUDED(job_ends_mu_);
  // Compares `rank`'s replica fingerprints with the others'; on a
  // divergence, diagnoses it and heals the round or fails the job (when
  // `can_heal` is false, as at completion, it fails).
  void RecordFingerprints(JobHealth* job, int rank,
                          const v1::WorkerMetrics& metrics, bool can_heal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  void OnDivergence(JobHealth* job, DivergenceDetector::Outcome outcome,
                    bool can_heal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Heartbeat, but for ReportQueued.
  absl::StatusOr<bool> HandleHeartbeat(Session* session,
                                       v1::HeartbeatRequest* request,
                                       v1::HeartbeatResponse* response);
  // Checks a completion and finds its member; INVALID_ARGUMENT, NOT_FOUND,
  // ABORTED, FAILED_PRECONDITION as Heartbeat.
  absl::Status CheckCompletion(Session* session,
                               const v1::ReportCompletionRequest& request);
  // A member's completion seen: heard, its last metrics and fingerprints
  // (a divergence found now fails the job).
  void NoteCompletionLocked(JobHealth* job, int rank,
                            const v1::ReportCompletionRequest& request,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Adds the member's exit to `update` (counting a success; the first
  // failure sets the job's FAILED and its reason).
  void AddCompletionLocked(JobHealth* job, int rank,
                           const v1::ReportCompletionRequest& request,
                           HealthUpdate* update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // The completions of `ranks` of `job` (`requests` by the same index), in
  // one transition; each one's answer into `answers` at its `slots` index.
  void RecordCompletions(
      JobHealth* job, const std::vector<int>& ranks,
      const std::vector<const v1::ReportCompletionRequest*>& requests,
      const std::vector<size_t>& slots,
      std::vector<absl::StatusOr<v1::JobState>>* answers)
      ABSL_LOCKS_EXCLUDED(job->mu);
  // Logs (and clears) the job's broken streams and reconnections.
  void LogReconnects(JobHealth* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Sets or clears the hang diagnosis; `allowance` is the backlog the
  // coordinator knows it has (see PollJob), added to the hang timeout.
  void DiagnoseHang(JobHealth* job, absl::Time now, absl::Duration allowance)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // The hang timeout in force: the job's (fixed or self-set), but at least
  // kHeartbeatsToSeeProgress of its members' heartbeat intervals at the
  // slowest factor one of them may be on. The coordinator sees progress
  // only in heartbeats: in a healthy job of steps of milliseconds, whose
  // timeout sets itself to --min_hang_timeout, the next report of a
  // finished collective may come a whole interval after the last (the
  // ranks heartbeat in step), later on a loaded machine or while shedding.
  static absl::Duration HangTimeoutLocked(const JobHealth& job)
      ABSL_SHARED_LOCKS_REQUIRED(job.mu);
  static constexpr int kHeartbeatsToSeeProgress = 2;
  // A new hang verdict, ranks grouped by (last finished, last started) most
  // advanced first: asks the ranks behind and one ahead for their stacks.
  void AskForStacks(
      JobHealth* job,
      const std::map<std::pair<int64_t, int64_t>, std::vector<int>,
                     std::greater<>>& groups,
      absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Whether every active member heartbeated since half the hang timeout
  // in force (`timeout`) after the last progress: by then a rank that is
  // not stuck has started its next collective (steps take a tenth of the
  // timeout or less), so who is behind can be read from these reports. An older one (a
  // heartbeat delayed by load) would show a rank that moved on as behind.
  static bool PositionsSettled(const JobHealth& job, absl::Duration timeout)
      ABSL_SHARED_LOCKS_REQUIRED(job.mu);
  // The hang is over (or never was): clears its diagnosis and stacks.
  static void ClearHang(JobHealth* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);

  JobManager* const jobs_;
  Clock* const clock_;
  const HealthConfig config_;
  const LossCallback on_loss_;
  const JobEndedCallback on_job_ended_;
  const HealCallback on_heal_;
  const RebalanceCallback on_rebalance_;
  // Job ends and heals recorded under a job's lock, for ReportQueued; taken
  // under the jobs' locks, and nothing is taken under it.
  struct JobEnd {
    std::string job_id;
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    std::string reason;
  };
  absl::Mutex job_ends_mu_;
  std::vector<JobEnd> job_ends_ ABSL_GUARDED_BY(job_ends_mu_);
  std::vector<Heal> heals_ ABSL_GUARDED_BY(job_ends_mu_);
  std::vector<Rebalance> rebalances_ ABSL_GUARDED_BY(job_ends_mu_);
  // Divergences found, by job, for divergences_by_job_.
  std::vector<std::pair<std::string, v1::Divergence>> found_
      ABSL_GUARDED_BY(job_ends_mu_);
  std::atomic<int64_t> divergences_{0};  // divergences found
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> heartbeats_{0};
  QueueDelays queue_delays_;  // ReportQueueDelay
  HeartbeatShedder shedder_;
  // Held by Poll() throughout (it is called from one thread at a time).
  absl::Mutex poll_mu_;  // taken before mu_ and the jobs' locks
  // Members heard from and overdue, and the heartbeats they send, as of
  // the last Poll, for the next one's shedder update.
  HeartbeatShedder::Backlog polled_ ABSL_GUARDED_BY(poll_mu_);
  // job id -> its wait for turns under a cap, as last reported.
  absl::flat_hash_map<std::string, absl::Duration> turn_waits_
      ABSL_GUARDED_BY(poll_mu_);

  // Held while a round's monitoring starts (FindOrStart), before mu_.
  absl::Mutex start_mu_;
  mutable absl::Mutex mu_;
  // job id -> the monitoring of its latest round.
  absl::flat_hash_map<std::string, std::shared_ptr<JobHealth>> jobs_health_
      ABSL_GUARDED_BY(mu_);
  // job id -> the latest round asked to re-form at a step boundary, for a
  // round whose monitoring starts after the request.
  absl::flat_hash_map<std::string, int64_t> reform_requests_
      ABSL_GUARDED_BY(mu_);
  // job id -> its latest divergence, shown in every later round's status
  // too (a heal re-forms the round).
  absl::flat_hash_map<std::string, v1::Divergence> divergences_by_job_
      ABSL_GUARDED_BY(mu_);
  // job id -> its latest rebalance, shown in every later round's status.
  absl::flat_hash_map<std::string, v1::Rebalance> rebalances_by_job_
      ABSL_GUARDED_BY(mu_);
};

class HealthManager::Session {
 private:
  friend class HealthManager;
  uint64_t id = 0;  // unique per stream (NewSession); 0 for a one-off call
  int queue = -1;   // the completion queue serving it (NewSession)
  std::shared_ptr<JobHealth> job;
  std::string job_id;
  int64_t round = 0;
  int rank = -1;
  std::string incarnation_id;
  // JobHealth::generation last sent to the worker; 0: nothing sent yet.
  int64_t generation_sent = 0;
};

// "0,1,2" or, for runs of 4 or more, "0-9,12": sorted ranks, at most
// `max_items` items and then "...".
std::string FormatRanks(const std::vector<int>& ranks, size_t max_items = 16);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HEALTH_MANAGER_H_
