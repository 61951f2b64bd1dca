// The coordinator's queue delay: how late it runs what arrives now, over
// all its completion queues and on each.
#ifndef GRADSYNC_SERVER_QUEUE_DELAYS_H_
#define GRADSYNC_SERVER_QUEUE_DELAYS_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace gradsync {

// The latest queue delays reported (CompletionQueues::Delays, and the wait
// for a turn under a heartbeat rate cap): the largest, and each queue's. A
// heartbeat stream is served by one queue, so its heartbeats wait that
// queue's delay, which can be well below the largest of 32.
//
// Thread-safe and lock-free: one thread reports (the coordinator's poll
// loop), any reads (heartbeat handlers); a reader may see some queues of
// the latest report and others of the one before.
class QueueDelays {
 public:
  // Keeps a delay for each of `queues` queues (none when 0 or less).
  explicit QueueDelays(int queues);

  // Records the delays now: `overall`, the largest, and `per_queue`, queue
  // i's at [i]; a queue beyond the end of `per_queue` (all of them when it
  // is empty) reads as `overall`.
  void Report(absl::Duration overall,
              absl::Span<const absl::Duration> per_queue = {});

  // The largest delay reported last.
  absl::Duration overall() const;
  // Queue `queue`'s delay reported last; `overall()` for an unknown queue
  // (below 0, or not below the count given at construction).
  absl::Duration Of(int queue) const;

 private:
  const int queues_;
  std::atomic<int64_t> overall_ns_{0};
  const std::unique_ptr<std::atomic<int64_t>[]> per_queue_ns_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_QUEUE_DELAYS_H_
