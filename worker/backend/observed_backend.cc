#include "worker/backend/observed_backend.h"

#include <utility>

namespace gradsync {

ObservedBackend::ObservedBackend(Backend* inner)
    : Backend(inner->options()), inner_(inner) {}

std::shared_ptr<Work> ObservedBackend::Record(std::shared_ptr<Work> work,
                                              const char* op, DataType dtype,
                                              int64_t count) {
  if (work->sequence() == 0) return work;  // refused: never ran
  absl::MutexLock lock(&mu_);
  pending_.push_back({work->sequence(), op, dtype, count});
  if (pending_.size() > kMaxPending) pending_.pop_front();
  last_started_ = std::max<uint64_t>(last_started_, work->sequence());
  in_flight_.push_back(work);
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

uint64_t ObservedBackend::last_finished() const {
  absl::MutexLock lock(&mu_);
  while (!in_flight_.empty() && in_flight_.front()->IsCompleted()) {
    last_finished_ = in_flight_.front()->sequence();
    in_flight_.pop_front();
  }
  return last_finished_;
}

}  // namespace gradsync
