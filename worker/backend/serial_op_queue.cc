#include "worker/backend/serial_op_queue.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gradsync {

SerialOpQueue::SerialOpQueue(std::string backend, int rank, int world_size,
                             std::function<void()> on_thread_start)
    : backend_(std::move(backend)), rank_(rank), world_size_(world_size) {
  thread_ =
      std::thread([this, start = std::move(on_thread_start)] { Loop(start); });
}

SerialOpQueue::~SerialOpQueue() { Shutdown(); }

std::shared_ptr<Work> SerialOpQueue::Enqueue(const char* collective,
                                             RunFn run) {
  Op op;
  {
    absl::MutexLock lock(&mu_);
    op.sequence = ++last_sequence_;
    op.work = std::make_shared<Work>(op.sequence);
    op.collective = collective;
    op.run = std::move(run);
    if (!stopping_) {
      std::shared_ptr<Work> work = op.work;
      queue_.push_back(std::move(op));
      return work;
    }
  }
  Cancel(op);
  return op.work;
}

void SerialOpQueue::Shutdown(const std::function<void()>& interrupt) {
  std::deque<Op> cancelled;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cancelled.swap(queue_);
  }
  for (Op& op : cancelled) Cancel(op);
  if (interrupt) interrupt();
  if (thread_.joinable()) thread_.join();
}

std::string SerialOpQueue::Describe(const char* collective,
                                    uint64_t sequence) const {
  return absl::StrCat(backend_, " ", collective, " #", sequence, " (rank ",
                      rank_, " of ", world_size_, ")");
}

void SerialOpQueue::Loop(const std::function<void()>& on_thread_start) {
  if (on_thread_start) on_thread_start();
  for (;;) {
    Op op;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SerialOpQueue::HasOpOrStopping));
      // Stopping, and Shutdown() has taken (cancelled) what was left.
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    const absl::Time started = absl::Now();
    absl::Status status = Run(op);
    op.work->SetRunTime(started, absl::Now());
    op.work->Finish(std::move(status));
  }
}

absl::Status SerialOpQueue::Run(Op& op) {
  const std::string where = Describe(op.collective, op.sequence);
  if (!broken_.ok()) {
    return absl::AbortedError(absl::StrCat(
        where, ": not run: an earlier collective failed (", broken_.ToString(),
        "); create a new backend in a new round"));
  }
  if (!op.run) return absl::OkStatus();  // no elements
  absl::Status status = op.run(op.sequence, where);
  if (!status.ok()) broken_ = status;
  return status;
}

void SerialOpQueue::Cancel(Op& op) const {
  op.work->Finish(absl::CancelledError(
      absl::StrCat(Describe(op.collective, op.sequence),
                   ": cancelled: the backend was destroyed before it ran")));
}

}  // namespace gradsync
