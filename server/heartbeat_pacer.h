// HeartbeatPacer: a cap on the heartbeats the coordinator handles per
// second (--max_heartbeat_rate), shared fairly across jobs. A message read
// from a heartbeat stream is handled at the turn this gives it, the stream
// waiting meanwhile without reading its next message, so what is past the
// cap waits in gRPC's and the kernel's buffers, as on a saturated machine.
// Tests and benchmarks reach the coordinator's capacity cheaply with it;
// an operator can leave CPU to rendezvous and key-value calls with it.
//
// Fair across jobs: each job has its own line of turns. While n jobs have
// heartbeats waiting for a turn, each job's turns are n/rate apart per
// heartbeat, so each gets an equal share of the cap; a job that sends less
// than its share waits for nobody, however long another job's line is (a
// job of 3 members beside a flood of 20,000 is handled at once; with one
// line for all, its heartbeats waited behind the whole flood and came late,
// and every job's LOST deadline was stretched by that). Turns already given
// stay: a job that starts to share while another's line is long gets its
// share on top of that line's turns until they have run (the benchmark's
// second flood job of 10,000 starting behind the first: 2,099 heartbeats a
// second over a 30 s level capped at 2,000); past that, the jobs sharing
// get the cap between them.
//
// What each job's last message still waits (Waits) is what its members'
// silence may be excused by under the cap (HealthManager's allowance for a
// job that keeps time follows its own line, not the longest).
//
// Thread-safe; time is passed in (calls' `now` need not be monotonic
// across threads: a `now` before a job's line only means its turn is
// later than `now`).
#ifndef GRADSYNC_SERVER_HEARTBEAT_PACER_H_
#define GRADSYNC_SERVER_HEARTBEAT_PACER_H_

#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

class HeartbeatPacer {
 public:
  // At most `per_second` heartbeats a second (> 0).
  explicit HeartbeatPacer(double per_second);

  // When a message carrying `heartbeats` of job `job_id`, read at `now`,
  // may be handled (`now` when it need not wait; a message of no
  // heartbeats never waits).
  absl::Time Turn(absl::string_view job_id, int heartbeats, absl::Time now);

  // How long each job's message given a turn last still waits for it, at
  // `now`: jobs whose turns are all past are left out.
  struct Waits {
    absl::Duration longest;  // zero when no job waits
    absl::flat_hash_map<std::string, absl::Duration> jobs;
  };
  Waits WaitsAt(absl::Time now) const;

 private:
  // One job's line of turns.
  struct Line {
    absl::Time last_turn = absl::InfinitePast();  // the turn given last
    absl::Time next = absl::InfinitePast();       // its next free turn
  };
  // Drops the lines whose turns are all past `now`.
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration spacing_;  // 1/rate
  mutable absl::Mutex mu_;
  // The jobs whose lines still have a turn to give after the last call's
  // `now` (so their count is how many share the cap).
  absl::flat_hash_map<std::string, Line> lines_ ABSL_GUARDED_BY(mu_);
  // Each line's `next` as it was set (the latest one is the line's own;
  // older ones are skipped), earliest first: how lines are dropped.
  using End = std::pair<absl::Time, std::string>;
  std::priority_queue<End, std::vector<End>, std::greater<End>> ends_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HEARTBEAT_PACER_H_
