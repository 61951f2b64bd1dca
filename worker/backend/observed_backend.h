// A Backend decorator that records what a rank's collectives are doing, for
// its heartbeats: a fingerprint of every collective it issues (for desync
// detection), and the sequence numbers of the last one started and the last
// one finished (for hang diagnosis); and since when the oldest unfinished
// one is in flight (for the collective watchdog).
#ifndef GRADSYNC_WORKER_BACKEND_OBSERVED_BACKEND_H_
#define GRADSYNC_WORKER_BACKEND_OBSERVED_BACKEND_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "worker/backend/backend.h"

namespace gradsync {

// What identifies one collective across ranks.
struct CollectiveRecord {
  // The wrapped backend's sequence number (Work::sequence()).
  uint64_t sequence = 0;
  std::string op;  // "allreduce", "broadcast", "allgather", "barrier"
  DataType dtype = DataType::kUInt8;
  int64_t count = 0;
};

// Forwards every collective to `inner` (which must outlive it) and returns
// its Work unchanged. Collectives refused for bad arguments (sequence 0) are
// not recorded. Thread-safe.
class ObservedBackend final : public Backend {
 public:
  // `clock` (default: the real one) times the collectives; it must outlive
  // the backend.
  explicit ObservedBackend(Backend* inner, Clock* clock = RealClock::Get());

  std::string name() const override { return inner_->name(); }
  bool stream_ordered() const override { return inner_->stream_ordered(); }
  std::shared_ptr<Work> AllReduce(Buffer buffer, ReduceOp op) override;
  std::shared_ptr<Work> Broadcast(Buffer buffer, int root) override;
  std::shared_ptr<Work> AllGather(Buffer input, Buffer output) override;
  std::shared_ptr<Work> Barrier() override;
  void Abort() override { inner_->Abort(); }

  // The records of collectives issued since the last call, in issue order
  // (at most the newest `kMaxPending`).
  std::vector<CollectiveRecord> TakeRecords();

  // The highest sequence number issued, and the highest one such that it and
  // every collective before it have completed (0: none).
  uint64_t last_started() const;
  uint64_t last_finished() const;

  // The oldest collective issued and not yet completed: its sequence number
  // and when it was issued. Unset when none is in flight.
  struct InFlight {
    uint64_t sequence = 0;
    absl::Time issued;
  };
  std::optional<InFlight> oldest_in_flight() const;

  static constexpr size_t kMaxPending = 1024;

 private:
  std::shared_ptr<Work> Record(std::shared_ptr<Work> work, const char* op,
                               DataType dtype, int64_t count);

  // Pops the completed collectives at the front of in_flight_.
  void DropFinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Backend* const inner_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::deque<CollectiveRecord> pending_ ABSL_GUARDED_BY(mu_);
  // Issued collectives not yet seen complete, in issue order, with the time
  // each was issued.
  mutable std::deque<std::pair<std::shared_ptr<Work>, absl::Time>> in_flight_
      ABSL_GUARDED_BY(mu_);
  uint64_t last_started_ ABSL_GUARDED_BY(mu_) = 0;
  mutable uint64_t last_finished_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_OBSERVED_BACKEND_H_
