#include "server/completion_batcher.h"

#include <algorithm>
#include <iterator>

namespace gradsync {

CompletionBatcher::CompletionBatcher(HealthManager* health)
    : health_(health), thread_([this] { Loop(); }) {}

CompletionBatcher::~CompletionBatcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void CompletionBatcher::Report(v1::ReportCompletionRequest request, Done done) {
  absl::MutexLock lock(&mu_);
  queued_.push_back({std::move(request), std::move(done)});
}

void CompletionBatcher::Loop() {
  while (true) {
    std::vector<Queued> batch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CompletionBatcher* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) {
            return b->stopping_ || !b->queued_.empty();
          },
          this));
      if (queued_.empty()) return;  // stopping, and nothing left
      const size_t n = std::min(queued_.size(), kMaxBatch);
      batch.assign(std::make_move_iterator(queued_.begin()),
                   std::make_move_iterator(queued_.begin() + n));
      queued_.erase(queued_.begin(), queued_.begin() + n);
    }
    Record(std::move(batch));
  }
}

void CompletionBatcher::Record(std::vector<Queued> batch) {
  std::vector<const v1::ReportCompletionRequest*> requests;
  requests.reserve(batch.size());
  for (const Queued& q : batch) requests.push_back(&q.request);
  std::vector<absl::StatusOr<v1::JobState>> answers =
      health_->ReportCompletions(requests);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].done(std::move(answers[i]));
  }
}

}  // namespace gradsync
