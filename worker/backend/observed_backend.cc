#include "worker/backend/observed_backend.h"

#include <utility>

namespace gradsync {

ObservedBackend::ObservedBackend(Backend* inner, Clock* clock)
    : Backend(inner->options()), inner_(inner), clock_(clock) {}

std::shared_ptr<Work> ObservedBackend::Record(std::shared_ptr<Work> work,
                                              const char* op, DataType dtype,
                                              int64_t count) {
  if (work->sequence() == 0) return work;  // refused: never ran
  absl::MutexLock lock(&mu_);
  pending_.push_back({work->sequence(), op, dtype, count});
  if (pending_.size() > kMaxPending) pending_.pop_front();
  last_started_ = std::max<uint64_t>(last_started_, work->sequence());
  in_flight_.emplace_back(work, clock_->Now());
  return work;
}

std::shared_ptr<Work> ObservedBackend::AllReduce(Buffer buffer, ReduceOp op) {
  return Record(inner_->AllReduce(buffer, op), "allreduce", buffer.dtype,
                static_cast<int64_t>(buffer.count));
}

std::shared_ptr<Work> ObservedBackend::Broadcast(Buffer buffer, int root) {
  return Record(inner_->Broadcast(buffer, root), "broadcast", buffer.dtype,
                static_cast<int64_t>(buffer.count));
}

std::shared_ptr<Work> ObservedBackend::AllGather(Buffer input, Buffer output) {
  return Record(inner_->AllGather(input, output), "allgather", input.dtype,
                static_cast<int64_t>(input.count));
}

std::shared_ptr<Work> ObservedBackend::Barrier() {
  return Record(inner_->Barrier(), "barrier", DataType::kUInt8, 0);
}

std::vector<CollectiveRecord> ObservedBackend::TakeRecords() {
  absl::MutexLock lock(&mu_);
  std::vector<CollectiveRecord> records(pending_.begin(), pending_.end());
  pending_.clear();
  return records;
}

uint64_t ObservedBackend::last_started() const {
  absl::MutexLock lock(&mu_);
  return last_started_;
}

void ObservedBackend::DropFinishedLocked() const {
  while (!in_flight_.empty() && in_flight_.front().first->IsCompleted()) {
    last_finished_ = in_flight_.front().first->sequence();
    in_flight_.pop_front();
  }
}

uint64_t ObservedBackend::last_finished() const {
  absl::MutexLock lock(&mu_);
  DropFinishedLocked();
  return last_finished_;
}

std::optional<ObservedBackend::InFlight> ObservedBackend::oldest_in_flight()
    const {
  absl::MutexLock lock(&mu_);
  DropFinishedLocked();
  if (in_flight_.empty()) return std::nullopt;
  return InFlight{in_flight_.front().first->sequence(),
                  in_flight_.front().second};
}

}  // namespace gradsync
