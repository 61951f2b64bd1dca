#include "server/queue_delays.h"

#include <algorithm>

namespace gradsync {

QueueDelays::QueueDelays(int queues)
    : queues_(std::max(0, queues)),
      per_queue_ns_(std::make_unique<std::atomic<int64_t>[]>(queues_)) {
  for (int i = 0; i < queues_; ++i) per_queue_ns_[i].store(0);
}

void QueueDelays::Report(absl::Duration overall,
                         absl::Span<const absl::Duration> per_queue) {
  const int64_t overall_ns = absl::ToInt64Nanoseconds(overall);
  for (int i = 0; i < queues_; ++i) {
    const size_t at = static_cast<size_t>(i);
    per_queue_ns_[i].store(at < per_queue.size()
                               ? absl::ToInt64Nanoseconds(per_queue[at])
                               : overall_ns,
                           std::memory_order_relaxed);
  }
  overall_ns_.store(overall_ns, std::memory_order_relaxed);
}

absl::Duration QueueDelays::overall() const {
  return absl::Nanoseconds(overall_ns_.load(std::memory_order_relaxed));
}

absl::Duration QueueDelays::Of(int queue) const {
  if (queue < 0 || queue >= queues_) return overall();
  return absl::Nanoseconds(
      per_queue_ns_[queue].load(std::memory_order_relaxed));
}

}  // namespace gradsync
