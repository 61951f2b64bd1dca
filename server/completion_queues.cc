#include "server/completion_queues.h"

#include <pthread.h>

#include <algorithm>

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
    queues_.push_back(std::move(queue));
  }
}

void CompletionQueues::Start() {
  for (auto& queue : queues_) {
    threads_.emplace_back([queue = queue.get()] { Drain(queue); });
  }
}

void CompletionQueues::Drain(Queue* queue) {
  pthread_setname_np(pthread_self(), "gs-queue");  // for top and perf
  void* tag = nullptr;
  bool ok = false;
  while (queue->cq_->Next(&tag, &ok)) static_cast<Tag*>(tag)->Run(ok);
}

void CompletionQueues::Shutdown() {
  for (auto& queue : queues_) {
    absl::MutexLock lock(&queue->mu_);
    if (!queue->open_) continue;
    queue->open_ = false;
    queue->cq_->Shutdown();
  }
  for (std::thread& t : threads_) t.join();
  if (threads_.empty()) {
    // Never started (the server failed to start): drain here, as a queue
    // must be before it is destroyed.
    for (auto& queue : queues_) Drain(queue.get());
  }
  threads_.clear();
  queues_.clear();
}

}  // namespace gradsync
