// HeartbeatPolicer: holds back the messages of one heartbeat stream that
// come faster than the coordinator asked for, so that a job whose workers
// ignore the interval they are told (a bug, or a hostile client) costs the
// coordinator at most kTolerance times what an obedient one does: past its
// capacity every job's LOST deadlines are stretched while it is behind
// (HeartbeatShedder::Allowance), so one such job would slow failure
// detection in every other. Should even that much keep the coordinator
// behind, HeartbeatShedder doubles the factor (stuck_windows), which this
// bucket follows.
//
// A token bucket in heartbeats: it fills at kTolerance x the rate the
// coordinator last asked of the stream's members (one heartbeat per
// interval each) and holds kBurstPerMember heartbeats per member. A message
// that finds it short waits until it would have filled; the stream reads
// nothing meanwhile, so what the worker sends beyond that waits in gRPC's
// and the kernel's buffers and HTTP/2 flow control stops the sender. An
// obedient worker is not held back: the burst covers the extra heartbeats
// the protocol allows (one more at the old interval after a longer one was
// told, one at once with the stacks a hang verdict asks for) and messages
// read together after the coordinator itself fell behind by up to about
// kBurstPerMember of their intervals (they were sent in time). The
// margins are wide on purpose: holding back obedient streams would hide an
// overload from HeartbeatShedder (their heartbeats would look on time and
// the queues short) while the backlog grew in the connections. A stream
// whose members were told no interval yet (its first message) is not held
// back.
//
// What it costs a worker that sends too fast: its own heartbeats are
// handled at the policed rate, in the order sent, so the coordinator sees
// its state that much later (a hung process is found LOST once its backlog
// is read); a closed or broken stream is seen at once, as for any stream.
//
// Not thread-safe: one per stream, used on that stream's queue thread.
#ifndef GRADSYNC_SERVER_HEARTBEAT_POLICER_H_
#define GRADSYNC_SERVER_HEARTBEAT_POLICER_H_

#include <cstdint>

#include "absl/time/time.h"

namespace gradsync {

class HeartbeatPolicer {
 public:
  // What the coordinator last asked of a stream's members.
  struct Asked {
    // Heartbeats a second, summed over the members told an interval.
    double rate = 0;
    // Members told an interval; 0: none yet (nothing is held back).
    int members = 0;
  };
  // The bucket fills this much faster than asked.
  static constexpr double kTolerance = 2;
  // Heartbeats per member the bucket holds.
  static constexpr int kBurstPerMember = 8;

  // When a message of `heartbeats` read at `now` may be handled: `now`,
  // or later when the stream sends faster than `asked` allows. Call once
  // per message, in order, with a non-decreasing `now`, and read the next
  // message only after the time returned.
  absl::Time Admit(int heartbeats, const Asked& asked, absl::Time now);

  // Messages held back since the stream began.
  int64_t held() const { return held_; }

 private:
  // Heartbeats the bucket holds, as of last_ (negative while a message
  // waits for what it took).
  double tokens_ = 0;
  // When the bucket was last filled; InfinitePast: not yet (it starts
  // full).
  absl::Time last_ = absl::InfinitePast();
  int64_t held_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HEARTBEAT_POLICER_H_
