// CollectiveWatchdog: a rank's collective timeout that follows the round's
// step times. The backends time collectives out after a fixed --timeout
// (minutes, so that a slow job never fails falsely); the watchdog aborts the
// round's backend much sooner when a collective has been in flight longer
// than the self-set timeout (SelfSetTimeout over this rank's step times in
// the round: factor x their 99th percentile, within [min, max]). With the
// defaults a job of 50 ms steps gives up on a hung peer after 10 s (the
// floor) instead of minutes; one of 10 s steps waits 100 s. The abort makes the rank's collectives fail, and it rejoins
// (a recovery); a peer that hangs outside any collective (the failpoint
// hang:STEP) has nothing to abort, and its peers' rejoin ends its round.
#ifndef GRADSYNC_WORKER_RUNTIME_COLLECTIVE_WATCHDOG_H_
#define GRADSYNC_WORKER_RUNTIME_COLLECTIVE_WATCHDOG_H_

#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/self_set_timeout.h"
#include "worker/backend/observed_backend.h"

namespace gradsync {

struct CollectiveWatchdogOptions {
  // The timeout is `factor` x the 99th percentile of the round's step
  // times; 0 turns the watchdog off (the backend's fixed timeout only).
  double factor = 10;
  // Acting on a verdict costs a re-form: a floor well above scheduling
  // noise on a loaded host.
  absl::Duration min = absl::Seconds(10);
  // Never longer than this (the backend's own timeout).
  absl::Duration max = absl::Minutes(5);
  // How often the watchdog's thread looks; zero: no thread (tests call
  // Check).
  absl::Duration check_every = absl::Milliseconds(100);
  Clock* clock = RealClock::Get();
};

// Watches one round's backend. Until SelfSetTimeout::kMinSamples steps of
// the round were added, and from a step after which rank 0 writes a
// checkpoint (the other ranks wait for it in their next collective) until
// the next step, it leaves the collectives to the backend's own timeout.
// Thread-safe; `backend` must outlive it. Lives as long as the round.
class CollectiveWatchdog {
 public:
  CollectiveWatchdog(ObservedBackend* backend,
                     const CollectiveWatchdogOptions& options);
  ~CollectiveWatchdog();  // stops its thread
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // This rank finished a step that took `step_time`; `checkpoint`: rank 0
  // writes a checkpoint after it.
  void AddStep(absl::Duration step_time, bool checkpoint);

  // The self-set timeout in force now; unset while the backend's applies.
  std::optional<absl::Duration> timeout() const;

  // Aborts the backend once if its oldest collective in flight is overdue.
  // The watchdog's thread calls it every check_every.
  void Check();

  // Why the watchdog aborted the backend (DEADLINE_EXCEEDED naming the
  // collective and the timeout); OK while it has not.
  absl::Status fired() const;

 private:
  std::optional<absl::Duration> TimeoutLocked() const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Run();

  ObservedBackend* const backend_;
  const CollectiveWatchdogOptions options_;
  mutable absl::Mutex mu_;
  SelfSetTimeout timeout_ ABSL_GUARDED_BY(mu_);
  bool after_checkpoint_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fired_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started last
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_COLLECTIVE_WATCHDOG_H_
