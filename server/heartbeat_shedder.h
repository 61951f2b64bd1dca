// HeartbeatShedder: tells when the coordinator is past its heartbeat
// capacity, and how much slower it should ask workers to send heartbeats
// (a factor on every job's interval). HealthManager feeds it what it
// measures and applies its decisions; see there for how the factor reaches
// the workers and stretches LOST deadlines.
//
// What it measures, all cheap and none needing a field on the wire or
// clocks that agree with the workers':
//  - queue delay: how late the coordinator runs what has arrived (the age
//    of the oldest event waiting in its completion queues, from a probe
//    alarm on each; under --max_heartbeat_rate, the longest wait for a
//    turn, HeartbeatPacer). It rises the moment heartbeats queue up,
//    before any member looks silent.
//  - late heartbeats: each heartbeat handled is compared with the same
//    member's previous one; it is late when the gap exceeds late_ratio x
//    the interval the member was asked for. Past capacity, heartbeats wait
//    in gRPC's and the kernel's buffers, where no probe sees them, and gaps
//    grow on most streams together. Members that died send nothing and so
//    add no sample; first heartbeats have no gap (a large round starting
//    up is not judged).
//  - new streams: heartbeats that opened a stream (a member's first, or
//    its first after reconnecting). A storm of them (a large round
//    starting, many workers reconnecting) is work no probe sees, done
//    ahead of reading the streams already open: in a benchmark run, 50,000
//    members' first heartbeats kept a job of 10,000 heard just before
//    unread for 3 s, and 257 of its members were LOST, with no queue delay
//    and no late heartbeat to show it.
//  - overdue members: heard from, not yet LOST, but silent longer than
//    late_ratio x their interval. Alone this cannot tell starved from dead,
//    so it only keeps an episode of being behind going (some connections
//    starve for seconds while others are served) and, past
//    overloaded_fraction, slows workers further once one has begun.
//
// Decisions:
//  - behind: the queue delay exceeds max_delay, or at least
//    overloaded_fraction of the heartbeats (over at least min_samples) are
//    late, or opened a stream (at least min_samples of them); checked on
//    every Update, so an episode begins at once. It lasts
//    until a window is calm; meanwhile Allowance() (the time behind, or the
//    largest queue delay seen, whichever is more) is added to LOST
//    deadlines: members starved meanwhile are not to blame.
//  - overloaded, once per `window`, and then the handled rate becomes the
//    capacity estimate:
//     - the queue delay exceeds max_delay: the factor goes up at once to
//       the smallest power of 2 (up to max_factor) at which the members'
//       heartbeats (expected_rate, from the intervals asked of every active
//       member) fit within headroom x that capacity; if they already do,
//       the backlog is draining and the factor stays. Not when the members
//       send fewer than min_rate heartbeats a second at their jobs' own
//       intervals: so few cannot be the load (a busy machine is), and
//       slowing them only delays finding failures.
//     - the heartbeats of members already told the current factor are late
//       as above, or, while behind, at least overloaded_fraction of the
//       members are overdue: the factor doubles (up to max_factor).
//     - behind for stuck_windows windows in a row at one factor, each with
//       a queue delay above max_delay / 4 or late heartbeats above
//       calm_fraction, and for longer than a backlog as deep as the
//       episode's largest queue delay D takes to drain when what arrives
//       is within headroom of what is handled (D / (1 - headroom)): the
//       factor doubles (up to max_factor), even when the intervals asked
//       say the load fits. The load is then more than those intervals
//       (workers that send faster than asked, held back only to
//       HeartbeatPolicer's tolerance) or the capacity less than its
//       estimate, and every job's LOST deadlines are stretched for as long
//       as the episode lasts. Overdue members alone do not count (a failure
//       to detect, not a load). Until the factor is back at 1, it then
//       halves only as a probe (below), since what halving brings back was
//       misjudged, and a probe is judged over stuck_windows windows.
//  - calm: queue delay at most max_delay / 4 all window, at most
//    calm_fraction of the heartbeats late (or fewer than min_samples), at
//    most calm_fraction opening a stream (or fewer than min_samples) and
//    at most calm_fraction of the members overdue (or fewer than
//    min_samples members heard from: in a small job a dead member would
//    otherwise keep an episode going, stretching its own LOST deadline).
//    After calm_windows calm windows in a row the factor halves, if twice
//    the handled (and the expected) rate, what halving brings back, stays
//    within headroom x the capacity estimate. Without that headroom it probes (halves
//    anyway) after probe_windows calm windows, in case the capacity grew; a
//    probe that overloads again within calm_windows doubles the wait before
//    the next one (up to 16 x probe_windows).
// Hysteresis: one overloaded window slows workers down; speeding them up
// takes several calm windows and room to spare.
// Logs factor changes, and the beginning and end of an episode of being
// behind (at most one episode each kEpisodeLogEvery; the next logged one
// counts those left out by what began them).
//
// Thread-safe: factor() is a lock-free read for the hot path; the rest
// takes a mutex.
#ifndef GRADSYNC_SERVER_HEARTBEAT_SHEDDER_H_
#define GRADSYNC_SERVER_HEARTBEAT_SHEDDER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

// The coordinator's heartbeat shedding settings (HealthConfig::shedding).
struct HeartbeatSheddingConfig {
  // Off: the coordinator always asks for the jobs' own intervals and never
  // extends LOST deadlines (past its capacity, live members are LOST).
  bool enabled = true;
  // The largest slowdown: intervals are multiplied by at most this (the
  // factor goes 1, 2, 4, ... up to it). It bounds how late a member that
  // truly stopped is found LOST: at most 2 x missed_heartbeats x interval x
  // max_factor after its last heartbeat was handled (the factor, plus an
  // allowance of at most as much while the coordinator is behind).
  int max_factor = 16;
  // How often the factor is decided, on what was measured meanwhile.
  absl::Duration window = absl::Seconds(1);
  // A queue delay above this is an overload; zero: half the coordinator's
  // default heartbeat interval (HealthManager fills it in).
  absl::Duration max_delay = absl::ZeroDuration();
  // Fewer heartbeats with a gap in a window are not judged late, nor
  // fewer members heard from judged overdue.
  int64_t min_samples = 100;
  // Heartbeats a second (at the jobs' own intervals) below which a queue
  // delay is not blamed on them: at tens of microseconds each, 50 a second
  // are a fraction of a percent of a core. The coordinator lowers it to its
  // --max_heartbeat_rate, a capacity an operator set.
  double min_rate = 50;
  // A heartbeat is late when it follows its member's previous one by more
  // than this many intervals (the interval that member was asked for); a
  // member silent that long is overdue.
  double late_ratio = 1.5;
  // Behind, and overloaded: at least this fraction late (or overdue).
  double overloaded_fraction = 0.2;
  // Calm: at most this fraction late and overdue.
  double calm_fraction = 0.05;
  // Calm windows in a row before the factor halves.
  int calm_windows = 3;
  // Windows in a row behind, at one factor, with queue delay or late
  // heartbeats, after which the factor doubles anyway (0: never); at
  // least as long as the episode's backlog takes to drain (see above).
  int stuck_windows = 10;
  // The factor halves only if twice the handled rate stays within this
  // fraction of the capacity estimate.
  double headroom = 0.7;
  // Calm windows in a row after which the factor halves even without that
  // headroom (a probe).
  int probe_windows = 60;
};

class HeartbeatShedder {
 public:
  // What HealthManager counted over some heartbeats; summed per window.
  struct Counts {
    int64_t heartbeats = 0;  // handled
    int64_t samples = 0;     // of those, with a previous one of the member
    int64_t late = 0;        // of the samples, late
    // Of the samples, those of members told the current factor (and not
    // changing from another), and how many of them were late.
    int64_t current_samples = 0;
    int64_t current_late = 0;

    Counts& operator+=(const Counts& other);
  };
  // What is waiting, as of one moment.
  struct Backlog {
    // How late the coordinator runs what has arrived (queue delay).
    absl::Duration delay;
    // Active members heard from, and of them those overdue.
    int64_t members = 0;
    int64_t overdue = 0;
    // Heartbeats per second the active members send at the intervals
    // their jobs' factors ask of them (heard from or not), and at their
    // jobs' own intervals.
    double expected_rate = 0;
    double full_rate = 0;
  };

  // A snapshot, for status and metrics.
  struct State {
    bool enabled = true;
    // Job intervals are multiplied by this now; 1 when not shedding.
    int factor = 1;
    // When the factor last left 1 (valid while factor > 1).
    absl::Time shedding_since = absl::InfinitePast();
    // Behind now, and since when (valid while behind).
    bool behind = false;
    absl::Time behind_since = absl::InfinitePast();
    // Shedding periods (the factor leaving 1) since start.
    int64_t shed_periods = 0;
    // In the last complete window: heartbeats handled per second, the
    // fraction of samples late, and the largest queue delay.
    double rate = 0;
    double late_fraction = 0;
    absl::Duration delay;
    // Heartbeats per second the coordinator handled when last overloaded
    // (raised by calm windows that handled more); 0 before any overload.
    double capacity = 0;
  };

  // Windows start at `start`.
  HeartbeatShedder(HeartbeatSheddingConfig config, absl::Time start);

  // The factor now (1, 2, 4, ...); 1 when disabled. It is the slowdown the
  // whole load needs; FairFactors shares it among the jobs.
  int factor() const { return factor_.load(std::memory_order_relaxed); }

  // Each job's factor at `factor` (the whole load's), for jobs that send
  // `rates` heartbeats a second at their own intervals: the load must come
  // down to their sum / `factor`, and that budget is shared max-min
  // fairly: every job may send an equal share of it, or its own rate when
  // that is less (what a job leaves is shared among the others). A job's
  // factor is the smallest power of 2, up to `max_factor`, that brings it
  // within a quarter above its share (factors move in powers of 2, and the
  // budget has the shedder's headroom). So a small job beside a flooding
  // one keeps its own interval, and its failures are found as fast as when
  // alone; one job alone gets `factor`.
  static std::vector<int> FairFactors(int factor,
                                      const std::vector<double>& rates,
                                      int max_factor);

  // Adds `counts` (heartbeats handled since the last call) and `backlog`
  // (as of now), and, once a window has passed since the last decision,
  // decides (see the class comment). Call it often (every poll) with a
  // non-decreasing `now`.
  void Update(absl::Time now, const Counts& counts, const Backlog& backlog);

  // How much longer than usual a member may be silent now: while behind,
  // the time since it began or the largest queue delay of the episode,
  // whichever is more; zero otherwise, and when disabled. HealthManager
  // caps it per job.
  absl::Duration Allowance(absl::Time now) const { return Allowed(now).all; }
  // Allowance(now), and when the episode began. HealthManager gives a job
  // whose own heartbeats keep time during the episode only what each
  // member's queue's delay grew by since its last heartbeat was handled:
  // the time behind stands for heartbeats starved where no probe sees
  // them, which that job's are not.
  struct Allowances {
    absl::Duration all;
    absl::Time since = absl::InfinitePast();  // valid while `all` > 0
  };
  Allowances Allowed(absl::Time now) const;

  State state() const;
  const HeartbeatSheddingConfig& config() const { return config_; }

 private:
  // Decides on the window that just ended (handled `rate` per second).
  // `processing`: the window had a queue delay or late heartbeats above
  // the calm limits (not only overdue members).
  void DecideLocked(absl::Time now, double rate, bool calm, bool processing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why an episode of being behind began.
  enum class Why { kNone, kQueued, kLate, kOpening };
  // Log an episode of being behind beginning and ending.
  void LogEpisodeBeginLocked(absl::Time now, Why why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogEpisodeEndLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // " (N shorter episodes were not logged since the last: ...)" naming what
  // began them, or "" when none; counts from zero again.
  std::string TakeUnloggedEpisodesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the factor (logging why), counting a shedding period when it
  // leaves 1.
  void SetFactorLocked(absl::Time now, int factor, const char* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `part` of `all` is at least overloaded_fraction, over at
  // least `min_all`.
  bool Overloaded(int64_t all, int64_t part, int64_t min_all) const;

  const HeartbeatSheddingConfig config_;
  // Written under mu_, read without it.
  std::atomic<int> factor_{1};

  mutable absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_);
  Counts window_ ABSL_GUARDED_BY(mu_);
  // The window's largest queue delay, and the latest backlog.
  absl::Duration window_delay_ ABSL_GUARDED_BY(mu_);
  Backlog backlog_ ABSL_GUARDED_BY(mu_);
  // The largest queue delay of the episode of being behind.
  absl::Duration episode_delay_ ABSL_GUARDED_BY(mu_);
  State state_ ABSL_GUARDED_BY(mu_);
  // Calm windows in a row.
  int calm_ ABSL_GUARDED_BY(mu_) = 0;
  // Windows in a row behind at the current factor with a queue delay or
  // late heartbeats (see stuck_windows).
  int stuck_ ABSL_GUARDED_BY(mu_) = 0;
  // The factor had to double for staying behind in this shedding period:
  // it halves only as a probe until the period ends.
  bool headroom_unreliable_ ABSL_GUARDED_BY(mu_) = false;
  // Calm windows before the next probe, and windows since the last probe
  // (-1: none awaiting a verdict).
  int probe_after_ ABSL_GUARDED_BY(mu_);
  int since_probe_ ABSL_GUARDED_BY(mu_) = -1;
  // When an episode's beginning was last logged, whether the current
  // episode's was, and episodes begun since without a log line, by what
  // began them (indexed by Why).
  static constexpr absl::Duration kEpisodeLogEvery = absl::Seconds(30);
  absl::Time episode_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool episode_logging_ ABSL_GUARDED_BY(mu_) = false;
  std::array<int64_t, 4> episodes_unlogged_ ABSL_GUARDED_BY(mu_) = {};
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HEARTBEAT_SHEDDER_H_
