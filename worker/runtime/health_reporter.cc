#include "worker/runtime/health_reporter.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/error_text.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "worker/runtime/thread_stacks.h"

namespace gradsync {
namespace {

// Events queued between two heartbeats, at most (the newest are kept).
constexpr size_t kMaxQueuedEvents = 256;

template <typename T>
void Append(const google::protobuf::RepeatedPtrField<T>& events,
            std::deque<T>* queue) {
  for (const T& event : events) {
    if (queue->size() == kMaxQueuedEvents) queue->pop_front();
    queue->push_back(event);
  }
}

// Replica fingerprints queued between two heartbeats, at most.
constexpr size_t kMaxQueuedFingerprints = 32;

// Queues `events`, dropping the oldest past kMaxQueuedFingerprints; the
// tensor names a dropped one carried move to the next.
void AppendFingerprints(
    const google::protobuf::RepeatedPtrField<v1::ReplicaFingerprint>& events,
    std::deque<v1::ReplicaFingerprint>* queue) {
  for (const v1::ReplicaFingerprint& f : events) {
    queue->push_back(f);
    if (queue->size() <= kMaxQueuedFingerprints) continue;
    v1::ReplicaFingerprint dropped = std::move(queue->front());
    queue->pop_front();
    if (queue->front().tensor_names_size() == 0) {
      queue->front().mutable_tensor_names()->Swap(
          dropped.mutable_tensor_names());
    }
  }
}

// Errors that mean "this member's round is over or was never valid":
// retrying the same member cannot help; a new Start() can.
bool EndsTheMember(const absl::Status& status) {
  return absl::IsAborted(status) || absl::IsFailedPrecondition(status) ||
         absl::IsNotFound(status) || absl::IsInvalidArgument(status);
}

}  // namespace

HealthReporter::HealthReporter(CoordinatorClient* client,
                               HealthReporterOptions options)
    : client_(client), options_(options), interval_(options.interval) {}

HealthReporter::~HealthReporter() { Stop(); }

void HealthReporter::Start(
    const v1::Assignment& assignment, const std::string& incarnation_id,
    std::function<void(const absl::Status&)> on_round_over) {
  absl::MutexLock lock(&mu_);
  on_round_over_ = std::move(on_round_over);
  v1::MemberRef member;
  member.set_job_id(assignment.job_id());
  member.set_round(assignment.round());
  member.set_rank(assignment.rank());
  member.set_incarnation_id(incarnation_id);
  member_ = std::move(member);
  ++member_generation_;
  snapshot_.Clear();
  snapshot_.set_state(v1::WORKER_STATE_STARTING);
  snapshot_.set_pid(getpid());
  collectives_.clear();
  ready_times_.clear();
  fingerprints_.clear();
  verdict_ = Verdict();
  stacks_asked_ = stacks_answered_ = 0;
  if (!thread_.joinable()) {
    // The first Start, or one after Finish()/Stop() ended the thread (a
    // member that rejoins to finish in the next round).
    stopping_ = false;
    thread_ = std::thread([this] { Run(); });
  }
}

void HealthReporter::Update(const v1::WorkerMetrics& metrics) {
  absl::MutexLock lock(&mu_);
  Append(metrics.recent_collectives(), &collectives_);
  Append(metrics.first_bucket_ready(), &ready_times_);
  AppendFingerprints(metrics.replica_fingerprints(), &fingerprints_);
  snapshot_ = metrics;
  if (snapshot_.pid() == 0) snapshot_.set_pid(getpid());
  snapshot_.clear_recent_collectives();
  snapshot_.clear_first_bucket_ready();
  snapshot_.clear_replica_fingerprints();
}

void HealthReporter::SetLiveFields(
    std::function<void(v1::WorkerMetrics*)> fill) {
  absl::MutexLock lock(&mu_);
  live_fields_ = std::move(fill);
}

HealthReporter::Verdict HealthReporter::verdict() const {
  absl::MutexLock lock(&mu_);
  return verdict_;
}

HealthReporter::Stats HealthReporter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Duration HealthReporter::interval() const {
  absl::MutexLock lock(&mu_);
  return interval_;
}

v1::HeartbeatRequest HealthReporter::NextRequestLocked() {
  v1::HeartbeatRequest request;
  *request.mutable_member() = *member_;
  *request.mutable_metrics() = snapshot_;
  if (live_fields_) live_fields_(request.mutable_metrics());
  for (v1::CollectiveFingerprint& f : collectives_) {
    *request.mutable_metrics()->add_recent_collectives() = std::move(f);
  }
  for (v1::StepReady& r : ready_times_) {
    *request.mutable_metrics()->add_first_bucket_ready() = std::move(r);
  }
  TakeFingerprintsLocked(request.mutable_metrics());
  collectives_.clear();
  ready_times_.clear();
  return request;
}

std::optional<int64_t> HealthReporter::TakeStacksRequestLocked() {
  if (stacks_asked_ == stacks_answered_) return std::nullopt;
  stacks_answered_ = stacks_asked_;
  return stacks_asked_;
}

void HealthReporter::TakeFingerprintsLocked(v1::WorkerMetrics* metrics) {
  for (v1::ReplicaFingerprint& f : fingerprints_) {
    *metrics->add_replica_fingerprints() = std::move(f);
  }
  fingerprints_.clear();
}

std::function<void(const absl::Status&)> HealthReporter::TakeRoundOverLocked() {
  round_over_generation_ = member_generation_;
  std::function<void(const absl::Status&)> callback;
  callback.swap(on_round_over_);
  return callback;
}

void HealthReporter::OnAnswer(int64_t generation,
                              const v1::HeartbeatResponse& response) {
  std::function<void(const absl::Status&)> round_over;
  {
    absl::MutexLock lock(&mu_);
    if (generation != member_generation_) return;
    ++stats_.answers;
    verdict_.state = response.job_state();
    verdict_.reason = response.reason();
    verdict_.reform_at_step_boundary = response.reform_at_step_boundary();
    if (response.stacks_request() != 0) {
      stacks_asked_ = response.stacks_request();  // the run loop notices
    }
    const absl::Duration interval =
        FromProtoDuration(response.heartbeat_interval());
    if (interval > absl::ZeroDuration() && interval != interval_) {
      // The run loop's wait notices (it waits for a change of interval_).
      if (member_.has_value() && (response.shedding_load() || shedding_)) {
        const std::string line = absl::StrCat(
            "heartbeats of job '", member_->job_id(), "' rank ",
            member_->rank(), ": every ", absl::FormatDuration(interval),
            " (was ", absl::FormatDuration(interval_), "): ",
            response.shedding_load() ? "the coordinator sheds heartbeat load"
                                     : "the coordinator keeps up again");
        if (response.shedding_load()) {
          GS_LOG(WARNING) << line;
        } else {
          GS_LOG(INFO) << line;
        }
      }
      interval_ = interval;
    }
    shedding_ = response.shedding_load();
    if (response.job_state() == v1::JOB_STATE_FAILED) {
      round_over = TakeRoundOverLocked();
    }
  }
  if (round_over) {
    round_over(absl::FailedPreconditionError(
        absl::StrCat("the job failed: ", response.reason())));
  }
}

// The reporting thread's state between turns of its loop.
struct HealthReporter::Loop {
  std::unique_ptr<HeartbeatStream> stream;
  int64_t stream_generation = 0;  // member_generation_ of `stream`
  int64_t dead_generation = -1;   // a member the coordinator refused
  int64_t answers_at_open = 0;    // stats_.answers when `stream` opened
  absl::Duration backoff;         // before the next reconnection
  bool warned = false;            // said that the coordinator is unreachable
  absl::BitGen random;
};

// The reporter's loop, one turn at a time: with no member (or one the
// coordinator refused) it waits for Start(); a stream that ended, or
// belongs to an old member, is retired (a refusal ends the member, any
// other error backs off before the next stream); otherwise it opens a
// stream when it has none, sends one heartbeat and waits for the next one's
// time. Stopping sends a last heartbeat and closes the stream cleanly.
void HealthReporter::Run() {
  pthread_setname_np(pthread_self(), "gs-heartbeat");  // for stacks and top
  Loop loop;
  loop.backoff = options_.initial_backoff;
  mu_.Lock();
  while (!stopping_) {
    if (!member_.has_value() || member_generation_ == loop.dead_generation) {
      AwaitNewMemberLocked();
      continue;
    }
    if (RetireStreamLocked(&loop)) continue;
    if (loop.stream == nullptr) OpenStreamLocked(&loop);
    if (loop.warned && stats_.answers > loop.answers_at_open) {
      // An answer on the new stream: the coordinator is back.
      GS_LOG(INFO) << "heartbeats reach the coordinator at "
                   << client_->target() << " again";
      loop.warned = false;
      loop.backoff = options_.initial_backoff;
    }
    SendAndAwaitNextLocked(&loop);
  }
  CloseLastStreamLocked(&loop);
}

void HealthReporter::AwaitNewMemberLocked() {
  const int64_t seen = member_generation_;
  const auto changed = [this, seen]() {
    mu_.AssertReaderHeld();
    return stopping_ || member_generation_ != seen;
  };
  mu_.Await(absl::Condition(&changed));
}

bool HealthReporter::RetireStreamLocked(Loop* loop) {
  if (loop->stream == nullptr) return false;
  const std::optional<absl::Status> ended = loop->stream->ended();
  if (!ended.has_value() && loop->stream_generation == member_generation_) {
    return false;
  }
  std::unique_ptr<HeartbeatStream> old = std::move(loop->stream);
  mu_.Unlock();
  if (!ended.has_value()) old->Close(options_.close_timeout).IgnoreError();
  old.reset();
  mu_.Lock();
  if (!ended.has_value() || ended->ok()) return false;
  ++stats_.failed_streams;
  if (EndsTheMember(*ended) && loop->stream_generation == member_generation_) {
    EndMemberLocked(loop, *ended);
  } else {
    BackOffLocked(loop, *ended);
  }
  return true;
}

void HealthReporter::EndMemberLocked(Loop* loop, const absl::Status& why) {
  GS_LOG(WARNING) << "heartbeats of job '" << member_->job_id() << "' round "
                  << member_->round() << " rank " << member_->rank()
                  << " stopped by the coordinator: " << why;
  loop->dead_generation = loop->stream_generation;
  if (auto round_over = TakeRoundOverLocked()) {
    mu_.Unlock();
    round_over(why);
    mu_.Lock();
  }
}

void HealthReporter::BackOffLocked(Loop* loop, const absl::Status& why) {
  if (!loop->warned) {
    GS_LOG(WARNING) << "cannot send heartbeats to the coordinator at "
                    << client_->target() << " (" << why
                    << "); training goes on, retrying with backoff";
    loop->warned = true;
  }
  const absl::Duration pause =
      loop->backoff * absl::Uniform(loop->random, 1.0 - options_.jitter,
                                    1.0 + options_.jitter);
  loop->backoff = std::min(options_.max_backoff, loop->backoff * 2);
  loop->stream_generation = member_generation_;
  const auto changed = [this, loop]() {
    mu_.AssertReaderHeld();
    return MemberChangedOrStoppingLocked(*loop);
  };
  mu_.AwaitWithTimeout(absl::Condition(&changed), pause);
}

void HealthReporter::OpenStreamLocked(Loop* loop) {
  loop->stream_generation = member_generation_;
  loop->answers_at_open = stats_.answers;
  mu_.Unlock();
  auto on_answer = [this, generation = loop->stream_generation](
                       const v1::HeartbeatResponse& r) {
    OnAnswer(generation, r);
  };
  std::unique_ptr<HeartbeatStream> stream =
      options_.open_stream ? options_.open_stream(std::move(on_answer))
                           : client_->OpenHeartbeatStream(std::move(on_answer));
  mu_.Lock();
  loop->stream = std::move(stream);
}

void HealthReporter::SendAndAwaitNextLocked(Loop* loop) {
  const std::optional<int64_t> stacks = TakeStacksRequestLocked();
  v1::HeartbeatRequest request = NextRequestLocked();
  mu_.Unlock();
  if (stacks.has_value()) {
    *request.mutable_metrics()->mutable_thread_stacks() =
        options_.capture_stacks ? options_.capture_stacks(*stacks)
                                : CaptureThreadStacks(*stacks);
    GS_LOG(INFO) << "job '" << request.member().job_id() << "' rank "
                 << request.member().rank()
                 << ": the coordinator diagnosed a hang; sending the stacks of "
                 << request.metrics().thread_stacks().threads_size()
                 << " threads";
  }
  const absl::Time sent_at = absl::Now();
  const bool queued = loop->stream->Send(std::move(request));
  mu_.Lock();
  if (queued) ++stats_.heartbeats_sent;
  // The next heartbeat is due one interval after this one, by the interval
  // the coordinator asks for at the time: a new one told while waiting
  // moves the deadline (earlier when it is shorter). A request for stacks
  // is answered at once.
  while (true) {
    const absl::Duration waiting_for = interval_;
    const auto woken = [this, loop, waiting_for]() {
      mu_.AssertReaderHeld();
      return MemberChangedOrStoppingLocked(*loop) ||
             interval_ != waiting_for || stacks_asked_ != stacks_answered_;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&woken),
                               sent_at + waiting_for) ||
        MemberChangedOrStoppingLocked(*loop) ||
        stacks_asked_ != stacks_answered_) {
      return;
    }
  }
}

void HealthReporter::CloseLastStreamLocked(Loop* loop) {
  // One last heartbeat with the final metrics, then a clean close (a
  // half-close, which does not make the member LOST).
  const bool send_last = loop->stream != nullptr &&
                         !loop->stream->ended().has_value() &&
                         loop->stream_generation == member_generation_;
  v1::HeartbeatRequest last;
  if (send_last) last = NextRequestLocked();
  mu_.Unlock();
  if (loop->stream != nullptr) {
    if (send_last) loop->stream->Send(std::move(last));
    loop->stream->Close(options_.close_timeout).IgnoreError();
  }
}

bool HealthReporter::MemberChangedOrStoppingLocked(const Loop& loop) const {
  return stopping_ || member_generation_ != loop.stream_generation;
}

absl::Status HealthReporter::Finish(bool success, int exit_code,
                                    const std::string& message) {
  v1::ReportCompletionRequest request;
  {
    absl::MutexLock lock(&mu_);
    if (!member_.has_value()) {
      return absl::FailedPreconditionError(
          "HealthReporter::Finish before Start: no member to report for");
    }
    *request.mutable_member() = *member_;
    *request.mutable_metrics() = snapshot_;
    // The last step's fingerprint, when no heartbeat carried it yet.
    TakeFingerprintsLocked(request.mutable_metrics());
  }
  Stop();
  request.set_success(success);
  request.set_exit_code(exit_code);
  request.set_message(CutErrorText(message));
  absl::StatusOr<v1::JobState> state = client_->ReportCompletion(request);
  if (!state.ok()) return state.status();
  absl::MutexLock lock(&mu_);
  verdict_.state = *state;
  return absl::OkStatus();
}

void HealthReporter::AwaitRoundOver() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &HealthReporter::RoundOverOrStoppingLocked));
}

bool HealthReporter::RoundOverOrStoppingLocked() const {
  return stopping_ || round_over_generation_ == member_generation_;
}

void HealthReporter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace gradsync
