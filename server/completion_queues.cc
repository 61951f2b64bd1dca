#include "server/completion_queues.h"

#include <pthread.h>

#include <algorithm>

#include "absl/time/clock.h"

namespace gradsync {

bool CompletionQueues::Queue::StartOp(absl::FunctionRef<void()> start) {
  absl::MutexLock lock(&mu_);
  if (!open_) return false;
  start();
  return true;
}

void CompletionQueues::AddTo(grpc::ServerBuilder* builder, int count) {
  for (int i = 0; i < std::max(1, count); ++i) {
    auto queue = std::make_unique<Queue>();
    queue->cq_ = builder->AddCompletionQueue();
    queue->index_ = static_cast<int>(queues_.size());
    queues_.push_back(std::move(queue));
  }
}

void CompletionQueues::Start() {
  for (auto& queue : queues_) {
    queue->keepalive_.alarm.Set(queue->cq(), gpr_inf_future(GPR_CLOCK_REALTIME),
                                &queue->keepalive_);
    threads_.emplace_back([queue = queue.get()] { Drain(queue); });
    queue->probe_.Arm();
  }
}

bool CompletionQueues::Queue::Probe::Arm() {
  const absl::Time due = absl::Now() + kProbePeriod;
  grpc::ServerCompletionQueue* cq = queue_->cq();
  return queue_->StartOp([&] {
    due_ns_.store(absl::ToUnixNanos(due), std::memory_order_relaxed);
    alarm_.Set(cq, absl::ToChronoTime(due), this);
  });
}

void CompletionQueues::Queue::Probe::Run(bool ok) {
  const int64_t due = due_ns_.exchange(0, std::memory_order_relaxed);
  if (!ok) return;  // cancelled: the queue is shutting down
  late_ns_.store(std::max<int64_t>(
                     0, absl::ToUnixNanos(absl::Now()) - due),
                 std::memory_order_relaxed);
  Arm();
}

absl::Duration CompletionQueues::Queue::Probe::Delay(absl::Time now) const {
  const int64_t due = due_ns_.load(std::memory_order_relaxed);
  const int64_t waiting =
      due > 0 ? absl::ToUnixNanos(now) - due : int64_t{0};
  return absl::Nanoseconds(
      std::max(waiting, late_ns_.load(std::memory_order_relaxed)));
}

std::vector<absl::Duration> CompletionQueues::Delays(absl::Time now) const {
  absl::MutexLock lock(&clear_mu_);
  std::vector<absl::Duration> delays;
  delays.reserve(queues_.size());
  for (const auto& queue : queues_) delays.push_back(queue->probe_.Delay(now));
  return delays;
}

void CompletionQueues::Drain(Queue* queue) {
  pthread_setname_np(pthread_self(), "gs-queue");  // for top and perf
  void* tag = nullptr;
  bool ok = false;
  while (queue->cq_->Next(&tag, &ok)) static_cast<Tag*>(tag)->Run(ok);
}

void CompletionQueues::Shutdown() {
  std::vector<Queue*> closing;
  for (auto& queue : queues_) {
    absl::MutexLock lock(&queue->mu_);
    if (!queue->open_) continue;
    queue->open_ = false;
    queue->probe_.Cancel();
    closing.push_back(queue.get());
  }
  if (!threads_.empty()) {
    // The keepalives hold every queue open until each thread ran what was
    // queued before its marker (the class comment says why).
    for (Queue* queue : closing) {
      queue->marker_.alarm.Set(queue->cq(), gpr_now(GPR_CLOCK_REALTIME),
                               &queue->marker_);
    }
    for (Queue* queue : closing) queue->marker_.ran.WaitForNotification();
    for (Queue* queue : closing) queue->keepalive_.alarm.Cancel();
  }
  for (Queue* queue : closing) queue->cq_->Shutdown();
  for (std::thread& t : threads_) t.join();
  if (threads_.empty()) {
    // Never started (the server failed to start): drain here, as a queue
    // must be before it is destroyed.
    for (auto& queue : queues_) Drain(queue.get());
  }
  threads_.clear();
  absl::MutexLock lock(&clear_mu_);
  queues_.clear();
}

}  // namespace gradsync
