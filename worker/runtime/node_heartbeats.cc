#include "worker/runtime/node_heartbeats.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace gradsync {

// A member's HeartbeatStream: a lane of the node's stream.
class NodeHeartbeats::Lane final : public HeartbeatStream {
 public:
  Lane(NodeHeartbeats* node, LaneState* state) : node_(node), state_(state) {}
  ~Lane() override {
    node_->CloseLane(state_);
    delete state_;
  }

  bool Send(v1::HeartbeatRequest request) override {
    return node_->LaneSend(state_, std::move(request));
  }
  std::optional<absl::Status> ended() const override {
    return node_->LaneEnded(state_);
  }
  // The lane's last heartbeat and its leaving go out with the next batch;
  // the coordinator answers nothing to a leaving member, so there is no
  // status to wait for.
  absl::Status Close(absl::Duration) override {
    std::optional<absl::Status> ended = node_->LaneEnded(state_);
    node_->CloseLane(state_);
    return ended.value_or(absl::OkStatus());
  }

 private:
  NodeHeartbeats* const node_;
  LaneState* const state_;
};

NodeHeartbeats::NodeHeartbeats(CoordinatorClient* client,
                               absl::Duration batch_window)
    : client_(client), batch_window_(batch_window) {
  thread_ = std::thread([this] { Run(); });
}

NodeHeartbeats::~NodeHeartbeats() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  std::shared_ptr<NodeHeartbeatStream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = std::move(stream_);
  }
  if (stream != nullptr) stream->Close(kCloseTimeout).IgnoreError();
}

std::pair<std::shared_ptr<NodeHeartbeatStream>, int64_t>
NodeHeartbeats::CurrentStream() {
  {
    absl::MutexLock lock(&mu_);
    if (stream_ != nullptr && !stream_->ended().has_value()) {
      return {stream_, generation_};
    }
  }
  // Opened without the lock: its answers take it.
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    generation = generation_ + 1;
  }
  std::shared_ptr<NodeHeartbeatStream> opened =
      client_->OpenNodeHeartbeatStream(
          [this, generation](const v1::NodeHeartbeatResponse& response) {
            OnAnswers(generation, response);
          });
  absl::MutexLock lock(&mu_);
  if (generation_ + 1 == generation &&
      (stream_ == nullptr || stream_->ended().has_value())) {
    stream_ = std::move(opened);
    generation_ = generation;
  }
  // else another lane opened one meanwhile: ours goes (cancelled, unused).
  return {stream_, generation_};
}

std::unique_ptr<HeartbeatStream> NodeHeartbeats::Open(
    std::function<void(const v1::HeartbeatResponse&)> on_response) {
  auto [stream, generation] = CurrentStream();
  auto* state = new LaneState();
  state->on_response = std::move(on_response);
  state->stream = std::move(stream);
  state->generation = generation;
  absl::MutexLock lock(&mu_);
  lanes_.push_back(state);
  return std::make_unique<Lane>(this, state);
}

bool NodeHeartbeats::LaneSend(LaneState* lane, v1::HeartbeatRequest request) {
  absl::MutexLock lock(&mu_);
  if (LaneEndedLocked(lane).has_value() ||
      std::find(lanes_.begin(), lanes_.end(), lane) == lanes_.end()) {
    return false;
  }
  lane->member = request.member();
  lane->pending = std::move(request);
  if (!first_pending_.has_value()) first_pending_ = absl::Now();
  return true;
}

std::optional<absl::Status> NodeHeartbeats::LaneEnded(
    const LaneState* lane) const {
  absl::MutexLock lock(&mu_);
  return LaneEndedLocked(lane);
}

std::optional<absl::Status> NodeHeartbeats::LaneEndedLocked(
    const LaneState* lane) const {
  if (lane->ended.has_value()) return lane->ended;
  return lane->stream->ended();
}

void NodeHeartbeats::CloseLane(LaneState* lane) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(lanes_.begin(), lanes_.end(), lane);
  if (it == lanes_.end()) return;
  lanes_.erase(it);
  if (lane->generation == generation_ && !LaneEndedLocked(lane).has_value() &&
      lane->member.has_value()) {
    if (lane->pending.has_value()) {
      last_heartbeats_.push_back(*std::move(lane->pending));
    }
    closed_.push_back(*lane->member);
    if (!first_pending_.has_value()) first_pending_ = absl::Now();
  }
  lane->pending.reset();
  // No answer may reach the lane's reporter once this returns.
  mu_.Await(absl::Condition(
      +[](int* dispatching) { return *dispatching == 0; }, &dispatching_));
}

bool NodeHeartbeats::AnyPendingLocked() const {
  return !closed_.empty() ||
         std::any_of(lanes_.begin(), lanes_.end(), [&](const LaneState* l) {
           return l->generation == generation_ && l->pending.has_value();
         });
}

bool NodeHeartbeats::AllPendingLocked() const {
  return std::all_of(lanes_.begin(), lanes_.end(), [&](const LaneState* l) {
    return l->generation != generation_ || l->pending.has_value() ||
           l->ended.has_value();
  });
}

void NodeHeartbeats::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || AnyPendingLocked();
    };
    mu_.Await(absl::Condition(&ready));
    if (!stopping_) {
      // Wait for every lane's heartbeat, within the window.
      auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || AllPendingLocked();
      };
      mu_.AwaitWithDeadline(
          absl::Condition(&all),
          first_pending_.value_or(absl::Now()) + batch_window_);
    }
    v1::NodeHeartbeatRequest batch;
    for (v1::HeartbeatRequest& last : last_heartbeats_) {
      *batch.add_heartbeats() = std::move(last);
    }
    for (LaneState* lane : lanes_) {
      if (lane->pending.has_value()) {
        if (lane->generation == generation_) {
          *batch.add_heartbeats() = *std::move(lane->pending);
        }
        lane->pending.reset();
      }
    }
    for (v1::MemberRef& closed : closed_) *batch.add_closed() = std::move(closed);
    last_heartbeats_.clear();
    closed_.clear();
    first_pending_.reset();
    std::shared_ptr<NodeHeartbeatStream> stream = stream_;
    if (stream != nullptr &&
        (batch.heartbeats_size() > 0 || batch.closed_size() > 0)) {
      mu_.Unlock();
      const bool sent = stream->Send(std::move(batch));
      mu_.Lock();
      if (sent) ++batches_sent_;
    }
    if (stopping_) return;
  }
}

void NodeHeartbeats::OnAnswers(int64_t generation,
                               const v1::NodeHeartbeatResponse& response) {
  std::vector<std::pair<std::function<void(const v1::HeartbeatResponse&)>,
                        const v1::HeartbeatResponse*>>
      deliveries;
  absl::MutexLock lock(&mu_);
  for (const v1::MemberHeartbeatResponse& answer : response.answers()) {
    const v1::MemberRef& m = answer.member();
    auto lane = std::find_if(lanes_.begin(), lanes_.end(), [&](LaneState* l) {
      return l->generation == generation && l->member.has_value() &&
             l->member->job_id() == m.job_id() && l->member->rank() == m.rank() &&
             l->member->round() == m.round() &&
             l->member->incarnation_id() == m.incarnation_id();
    });
    if (lane == lanes_.end()) continue;  // closed meanwhile
    if (answer.error_code() != 0) {
      (*lane)->ended = absl::Status(
          static_cast<absl::StatusCode>(answer.error_code()),
          answer.error_message());
      continue;
    }
    deliveries.emplace_back((*lane)->on_response, &answer.response());
  }
  if (deliveries.empty()) return;
  ++dispatching_;
  mu_.Unlock();
  for (auto& [deliver, answer] : deliveries) deliver(*answer);
  mu_.Lock();
  --dispatching_;
}

int64_t NodeHeartbeats::batches_sent() const {
  absl::MutexLock lock(&mu_);
  return batches_sent_;
}

int64_t NodeHeartbeats::streams_opened() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

}  // namespace gradsync
