// A job's rounds through their life: the one phase value the rendezvous
// writes, the events it tells the other managers about, and the one check
// of whether a call still acts in the live round.
//
// One way: the RendezvousManager is the only writer of a round's phase. The
// managers that keep per-round state of their own (KvManager: the round's
// store; HealthManager: the round's monitoring) follow it as RoundListeners
// that the composition root (Coordinator) registers; they never tell the
// rendezvous about a round's phase. What they find (a member lost, a job
// ended) goes to the rendezvous as an input through the composition root's
// callbacks, and comes back to them, if it changes a round, as an event.
#ifndef GRADSYNC_SERVER_ROUND_LIFECYCLE_H_
#define GRADSYNC_SERVER_ROUND_LIFECYCLE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// Where a job's rendezvous is. Transitions (RoundPhaseMayBecome allows these
// and no other; RendezvousManager::SetPhaseLocked is the one place that
// makes them):
//
//   kForming ------ min nodes complete ---------------> kLastCall
//   kSuperseded --- min nodes complete ---------------> kLastCall
//   kLastCall ----- below min nodes again ------------> kForming | kSuperseded
//   kForming | kLastCall | kSuperseded -- closes -----> kRunning
//   kRunning ------ a node waits, below max nodes ----> kReformRequested
//   kRunning | kReformRequested -- a member lost or rejoined, or a node
//                                  restarted ---------> kSuperseded
//   any but kEnded - the job ended -------------------> kEnded
//
// A restart on durable state starts a job in the phase its record says
// (kRunning or kSuperseded); that is where it starts, not a transition.
enum class RoundPhase {
  // No round has closed yet; joiners wait for the first.
  kForming,
  // Min nodes wait and the last call runs: the round closes when it ends,
  // or at once on max nodes.
  kLastCall,
  // The latest round runs; joiners wait as spares.
  kRunning,
  // The latest round runs below max nodes and a complete node waits: its
  // members were asked to re-form at their next step boundary.
  kReformRequested,
  // The latest round was superseded; the next one forms, awaiting the nodes
  // of the old round that were not lost.
  kSuperseded,
  // The job ended (succeeded or failed): nothing forms or runs again.
  kEnded,
};

// "forming", "last call", ...
absl::string_view RoundPhaseName(RoundPhase phase);

// Whether a job's rendezvous may go from `from` to `to` (see the picture).
bool RoundPhaseMayBecome(RoundPhase from, RoundPhase to);

// Whether the latest round of a job in `phase` runs (members train in it).
inline bool RoundRuns(RoundPhase phase) {
  return phase == RoundPhase::kRunning ||
         phase == RoundPhase::kReformRequested;
}

// A change of a round that other managers act on.
struct RoundEvent {
  enum class Kind {
    // Round `round` closed: its members are being answered with their
    // assignments.
    kClosed,
    // Round `round` was superseded for `reason`: its members must stop and
    // rejoin.
    kSuperseded,
    // Round `round` runs below max nodes and a node waits (`reason`): its
    // members should stop together at their next step boundary and rejoin.
    kReformRequested,
    // The job ended (`reason` says how); `round` is its latest round.
    kJobEnded,
    // The job ended long enough ago that everything about it is dropped;
    // `round` is its latest round known to the rendezvous (0: none).
    kForgotten,
  };
  Kind kind = Kind::kClosed;
  std::string job_id;
  int64_t round = 0;
  std::string reason;
};

// "closed", "superseded", ...
absl::string_view RoundEventName(RoundEvent::Kind kind);

// Told about round events, in the order they happened, one at a time.
//
// Ordering contract (RendezvousManager keeps it): every event a call to the
// rendezvous caused reaches every listener before any answer that call
// produced leaves; in particular a round's key-value store is open before
// any of its assignments leaves. Events are delivered without the
// rendezvous's own lock held, one delivery at a time across all threads,
// listeners in the order they were registered. A listener must not call
// back into the RendezvousManager from OnRoundEvent, and should return
// quickly (it delays answers). Events a listener has no use for it ignores.
class RoundListener {
 public:
  virtual ~RoundListener() = default;
  virtual void OnRoundEvent(const RoundEvent& event) = 0;
};

// The one check of whether a call made in round `asked` of `job_id` acts in
// the job's live round, given the job's latest closed round `latest` and
// whether that round runs. OK when it does; ABORTED when `asked` is over
// (older than `latest`, or `latest` superseded): the caller must rejoin;
// FAILED_PRECONDITION when `asked` has not closed.
absl::Status CheckRoundIsLive(absl::string_view job_id, int64_t asked,
                              int64_t latest, bool latest_runs);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_ROUND_LIFECYCLE_H_
