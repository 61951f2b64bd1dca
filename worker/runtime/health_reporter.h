// HealthReporter: a worker's heartbeats to the coordinator, off the training
// thread.
//
// The training loop hands it metrics with Update() (a copy under a mutex; it
// never touches the network), and a background thread sends the latest
// snapshot every heartbeat interval on one Monitor.Heartbeat stream. When the
// coordinator cannot be reached the reporter logs one warning, keeps the
// newest snapshot and reconnects with exponential backoff and jitter; training
// is never slowed. At the end, Finish() reports success or failure.
//
// The interval is the coordinator's to set: each answer carries the one it
// wants now (the job's, or longer while it sheds heartbeat load past its
// capacity), and the reporter sends its next heartbeat one such interval
// after its last one; a shorter interval told during a long wait takes
// effect at once.
//
//   HealthReporter reporter(client.get());
//   reporter.Start(assignment, node.incarnation_id());  // after every join
//   for (int64_t step = 1; ...; ++step) {
//     ... train ...
//     v1::WorkerMetrics m;
//     m.set_state(v1::WORKER_STATE_TRAINING);
//     m.set_step(step);
//     m.set_samples_per_second(...);
//     // Collectives this process started since the last Update, in issue
//     // order, with their sequence numbers (1, 2, ... per round):
//     *m.add_recent_collectives() = fingerprint;
//     m.set_last_started_collective(last_started_seq);
//     m.set_last_finished_collective(last_finished_seq);
//     // When this step's first gradient bucket became ready to reduce:
//     v1::StepReady* ready = m.add_first_bucket_ready();
//     ready->set_step(step);
//     *ready->mutable_time() = ToProtoTime(first_bucket_ready_time);
//     reporter.Update(m);
//     if (reporter.verdict().state == v1::JOB_STATE_FAILED) break;  // desync...
//   }
//   reporter.Finish(/*success=*/true, /*exit_code=*/0, "");
//
// Which fields are snapshots and which are events: see WorkerMetrics in
// proto/gradsync/v1/job.proto. Events (recent_collectives,
// first_bucket_ready; replica_fingerprints, the newest 32, the tensor names
// kept when the one carrying them is dropped) are queued until a heartbeat,
// or the completion report, carries them; every other field is replaced by
// each Update().
//
// When an answer asks for the process's stacks (a hang verdict), the
// reporter sends its next heartbeat at once with them
// (WorkerMetrics.thread_stacks, options.capture_stacks), once per request.
#ifndef GRADSYNC_WORKER_RUNTIME_HEALTH_REPORTER_H_
#define GRADSYNC_WORKER_RUNTIME_HEALTH_REPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/health.pb.h"
#include "proto/gradsync/v1/job.pb.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {

struct HealthReporterOptions {
  // Heartbeat interval until the coordinator answers with the one it wants.
  absl::Duration interval = absl::Seconds(1);
  // Reconnection backoff after a stream failed: starts at initial_backoff,
  // doubles up to max_backoff, each pause scaled by a random factor in
  // [1 - jitter, 1 + jitter]. max_backoff (with jitter) stays well inside the
  // grace a restarted coordinator gives members to heartbeat again (five
  // detection windows, 15 s by default).
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Milliseconds(500);
  double jitter = 0.2;
  // How long Finish() and Stop() wait for the stream to close.
  absl::Duration close_timeout = absl::Seconds(5);
  // Opens the heartbeat stream; by default the client's own stream per
  // member (CoordinatorClient::OpenHeartbeatStream). A node agent points it
  // at NodeHeartbeats::opener() to share one stream among its ranks.
  std::function<std::unique_ptr<HeartbeatStream>(
      std::function<void(const v1::HeartbeatResponse&)>)>
      open_stream;
  // Answers the coordinator's HeartbeatResponse.stacks_request (a hang
  // verdict): by default the stacks of this process's threads
  // (CaptureThreadStacks); a node agent points it at the process it reports
  // for. Runs on the reporter's thread, between heartbeats.
  std::function<v1::ThreadStacks(int64_t request)> capture_stacks;
};

// Thread-safe: Update() and verdict() may be called from any thread while
// the reporter runs. `client` must outlive the reporter.
class HealthReporter {
 public:
  // What the coordinator last said about the job.
  struct Verdict {
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;  // nothing heard yet
    std::string reason;
    // A node waits to join the round: the members should re-form at their
    // next step boundary (see TrainContext::reform_requested).
    bool reform_at_step_boundary = false;
  };
  // Counters for logs and tests.
  struct Stats {
    int64_t heartbeats_sent = 0;   // handed to a stream
    int64_t answers = 0;           // coordinator answers received
    int64_t failed_streams = 0;    // streams that ended with an error
  };

  explicit HealthReporter(CoordinatorClient* client,
                          HealthReporterOptions options = HealthReporterOptions());
  // Stop()s.
  ~HealthReporter();
  HealthReporter(const HealthReporter&) = delete;
  HealthReporter& operator=(const HealthReporter&) = delete;

  // Reports as the member `assignment` describes (the process joined with
  // `incarnation_id`); starts the sending thread on the first call, and
  // again after Finish() or Stop() ended it. Call it again after every
  // rejoin: the stream moves to the new round and queued events of the old
  // round are dropped. The new member's heartbeats start from a state of
  // their own (STARTING: no step, error or round-start times of the round
  // before) until the next Update. Heartbeats carry this process's pid
  // unless the metrics name another (a node agent's process): a process
  // that took an assignment its launcher joined for shows as itself.
  // Start, Finish and Stop are called from one thread.
  //
  // `on_round_over`, when set, is called once (on one of the reporter's
  // threads) when the coordinator says this member should stop: its stream
  // ended with ABORTED (the round was superseded), FAILED_PRECONDITION or
  // NOT_FOUND, or an answer said the job FAILED. The training loop may be
  // blocked in a collective that will never complete; this is the moment to
  // abort its process group. It must be quick and must not call the
  // reporter.
  void Start(const v1::Assignment& assignment, const std::string& incarnation_id,
             std::function<void(const absl::Status&)> on_round_over = nullptr);

  // Takes the training loop's latest metrics (see the header comment).
  // Cheap and non-blocking with respect to the network.
  void Update(const v1::WorkerMetrics& metrics);

  // Sets what fills each heartbeat's live fields as it is sent, or clears it
  // (nullptr): Telemetry's collective counters, read then rather than at its
  // last refresh, so that the coordinator's hang verdict sees which
  // collective a rank stands in as of that heartbeat. `fill` runs on the
  // reporter's thread under its lock: it must be quick and must not call
  // the reporter. Once SetLiveFields returned, the previous `fill` is not
  // running and never runs again.
  void SetLiveFields(std::function<void(v1::WorkerMetrics*)> fill);

  // The job's state as the coordinator last reported it (on the first
  // heartbeat and whenever it changes: FAILED on a desync, DEGRADED when a
  // member is lost, ...).
  Verdict verdict() const;

  Stats stats() const;

  // The interval heartbeats go at now: options.interval until the
  // coordinator answered, then the one it last asked for.
  absl::Duration interval() const;

  // Blocks until the coordinator ended the member of the latest Start() (the
  // moment its on_round_over runs, or would) or the reporter stops: for a
  // training thread that stands still on purpose (the failpoint hang:STEP)
  // and must go on once its round is over.
  void AwaitRoundOver();

  // Sends a last heartbeat, closes the stream cleanly, stops the thread and
  // reports completion (success, or failure with `exit_code` and `message`),
  // retrying while the coordinator is unreachable within the client's retry
  // budget. FAILED_PRECONDITION when Start() was never called.
  absl::Status Finish(bool success, int exit_code, const std::string& message);

  // Stops heartbeating without reporting completion (the coordinator will
  // mark the member LOST after the missed-heartbeat bound). Idempotent.
  void Stop();

 private:
  // The sending thread (a loop of turns: see Run in the .cc).
  void Run();
  struct Loop;  // the thread's state between turns
  // Waits for a Start() of a new member (or Stop()).
  void AwaitNewMemberLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `loop`'s stream when it ended or belongs to an old member; true
  // when the turn is over (the coordinator refused the member, or the
  // stream failed and the loop backed off).
  bool RetireStreamLocked(Loop* loop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The coordinator refused the member (`why`): no more heartbeats for it;
  // its on_round_over callback runs.
  void EndMemberLocked(Loop* loop, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stream failed (`why`): warns once, waits the backoff with jitter.
  void BackOffLocked(Loop* loop, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OpenStreamLocked(Loop* loop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one heartbeat and waits until the next is due, the member
  // changes or Stop().
  void SendAndAwaitNextLocked(Loop* loop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stopping: a last heartbeat and a clean close. Releases mu_.
  void CloseLastStreamLocked(Loop* loop) ABSL_UNLOCK_FUNCTION(mu_);
  // Whether a Start() or Stop() came since `loop`'s stream opened.
  bool MemberChangedOrStoppingLocked(const Loop& loop) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool RoundOverOrStoppingLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Takes the member's on_round_over callback (once), or returns an empty
  // one; the caller runs it without the lock.
  std::function<void(const absl::Status&)> TakeRoundOverLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next heartbeat: member, snapshot (its live fields filled now) and
  // the queued events.
  v1::HeartbeatRequest NextRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stacks request to answer in the next heartbeat, if any (taken: it
  // is answered once).
  std::optional<int64_t> TakeStacksRequestLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the queued replica fingerprints into `metrics`.
  void TakeFingerprintsLocked(v1::WorkerMetrics* metrics)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An answer on the stream opened for member generation `generation`:
  // ignored once Start() began another member (an answer to the last
  // round's member is not the new one's verdict).
  void OnAnswer(int64_t generation, const v1::HeartbeatResponse& response);

  CoordinatorClient* const client_;
  const HealthReporterOptions options_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::optional<v1::MemberRef> member_ ABSL_GUARDED_BY(mu_);
  // Counts Start() calls, so the thread notices a new member.
  int64_t member_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The member_generation_ whose round the coordinator ended last.
  int64_t round_over_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  // Whether the coordinator last said it sheds heartbeat load (for logs).
  bool shedding_ ABSL_GUARDED_BY(mu_) = false;
  v1::WorkerMetrics snapshot_ ABSL_GUARDED_BY(mu_);
  std::function<void(v1::WorkerMetrics*)> live_fields_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::CollectiveFingerprint> collectives_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StepReady> ready_times_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::ReplicaFingerprint> fingerprints_ ABSL_GUARDED_BY(mu_);
  Verdict verdict_ ABSL_GUARDED_BY(mu_);
  // The coordinator's latest HeartbeatResponse.stacks_request, and the one
  // last answered.
  int64_t stacks_asked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stacks_answered_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const absl::Status&)> on_round_over_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_HEALTH_REPORTER_H_
