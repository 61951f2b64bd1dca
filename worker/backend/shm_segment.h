// The shared-memory segment under ShmBackend: one POSIX shared-memory object
// that every rank of one host maps, holding a header of shared words, one
// record per rank and world_size + 1 data slots, and the futex barrier the
// ranks meet at. It also watches the peers' processes, so that a wait ends
// with UNAVAILABLE when a peer exits or leaves rather than at its timeout.
//
// Internal to the shm backend (shm_backend.cc), which bootstraps it through
// a Store and runs the collectives over its slots.
//
// Thread-safety: bootstrap (Create or Open, then Attach, WaitForAll and
// WatchPeers) runs on the creating thread; afterwards one thread (the
// backend's queue) uses the segment, except Leave(), which any thread may
// call. Lifetime: the mapping lasts as long as the Segment; the name in
// /dev/shm is removed by the backend once every rank has attached.
#ifndef GRADSYNC_WORKER_BACKEND_SHM_SEGMENT_H_
#define GRADSYNC_WORKER_BACKEND_SHM_SEGMENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradsync {
namespace shm_internal {

constexpr size_t kCacheLine = 64;
// The largest slot a rank may ask for (ShmOptions::slot_bytes).
constexpr size_t kMaxSlotBytes = size_t{1} << 30;

inline size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Why a rank left the group, as it records it in the segment.
enum class LeaveReason : uint32_t {
  kDestroyed = 1,  // its backend was destroyed
  kFailed = 2,     // one of its collectives failed
  kGaveUp = 3,     // its bootstrap failed
  kAborted = 4,    // its owner aborted it
};

// What a collective is, published by every rank so that they can check they
// run the same one.
enum class Kind : uint64_t { kAllReduce = 1, kBroadcast = 2, kAllGather = 3 };

struct Signature {
  Kind kind = Kind::kAllReduce;
  // AllReduce: op | dtype << 8. Broadcast: the root. AllGather: 0.
  uint64_t detail = 0;
  // AllReduce: elements. Broadcast: bytes. AllGather: bytes per rank.
  uint64_t count = 0;

  bool operator==(const Signature& other) const {
    return kind == other.kind && detail == other.detail && count == other.count;
  }
};

// The segment (all offsets fixed by the world size and slot size):
//   SegmentHeader                 shared words, each on its own cache line
//   RankRecord x world_size       one cache line per rank, written by it
//   (padding to a page)
//   slot x world_size             rank r's data for the current chunk
//   result slot                   the reduced chunk
struct Layout {
  // `slot_bytes` is a multiple of kCacheLine.
  Layout(int world_size, size_t slot_bytes);
  size_t slot_bytes;
  size_t records;  // offset of RankRecord[0]
  size_t slots;    // offset of rank 0's slot
  size_t total;
};

// In the segment; defined in shm_segment.cc.
struct SegmentHeader;
struct RankRecord;

// The mapped segment. Bootstrap runs on the creating thread; afterwards one
// thread (the backend's queue) uses it, except Leave(), which any thread may
// call.
class Segment {
 public:
  // Rank 0: creates, sizes, reserves and maps a new segment.
  // Barriers wait for the peers at most `timeout`.
  static absl::StatusOr<std::unique_ptr<Segment>> Create(
      const Layout& layout, int world_size, absl::Duration timeout,
      const std::string& where);
  // Other ranks: maps the segment `name` and checks it was made for
  // `layout` and `world_size`; if not, tells rank 0 (which then stops
  // waiting for `rank`).
  static absl::StatusOr<std::unique_ptr<Segment>> Open(
      const std::string& name, const Layout& layout, int world_size, int rank,
      absl::Duration timeout, const std::string& where);

  // Closes the peers' pidfds and unmaps the segment.
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  const std::string& name() const { return name_; }
  size_t slot_bytes() const { return layout_.slot_bytes; }
  char* slot(int rank) const {
    return base_ + layout_.slots + rank * layout_.slot_bytes;
  }
  char* result() const { return slot(world_size_); }

  // Bootstrap, in this order: record this rank's pid and count it in; wait
  // until every rank has; watch the peers' processes.
  absl::Status Attach(int rank, const std::string& where);
  // `cancel` (may be null) ends the wait with CANCELLED once set.
  absl::Status WaitForAll(const std::string& where,
                          const std::atomic<bool>* cancel);
  absl::Status WatchPeers(const std::string& where);

  // Publishes the collective this rank starts.
  void Begin(uint64_t sequence);
  void Begin(uint64_t sequence, const Signature& signature);
  // After the collective's first barrier: INTERNAL unless every rank began
  // the same one.
  absl::Status CheckSameCollective(const std::string& where) const;

  // Waits until every rank has entered this barrier, at most the timeout;
  // everything a rank wrote before entering is visible to all after it.
  // `closing` stops the wait with CANCELLED.
  absl::Status Barrier(const std::string& where,
                       const std::atomic<bool>& closing);

  // Records that this rank leaves the group (the first to leave is kept)
  // and wakes every waiter, so peers stop waiting for it.
  void Leave(LeaveReason reason);

 private:
  struct Peer {
    int rank = 0;
    pid_t pid = 0;
    int pidfd = -1;        // readable once the process has exited
    bool watched = false;  // false: our own process, or a foreign namespace
  };

  Segment(std::string name, char* base, const Layout& layout, int world_size,
          absl::Duration timeout)
      : name_(std::move(name)),
        base_(base),
        layout_(layout),
        world_size_(world_size),
        timeout_(timeout) {}

  SegmentHeader& header() const;
  RankRecord& record(int rank) const;
  RankRecord& Mine() const { return record(rank_); }
  Signature SignatureOf(int rank) const;

  // UNAVAILABLE naming the rank that left, if one did.
  absl::Status CheckNobodyLeft(const std::string& where) const;
  // UNAVAILABLE naming a watched peer whose process has exited, if one has.
  absl::Status CheckPeersAlive(const std::string& where) const;
  // The same during bootstrap, for the peers attached so far.
  absl::Status CheckAttachedAlive(const std::string& where) const;
  // DEADLINE_EXCEEDED naming the ranks that have not entered barrier
  // `barrier` (this rank's count).
  absl::Status BarrierTimeout(const std::string& where, uint64_t barrier) const;

  const std::string name_;
  char* const base_;
  const Layout layout_;
  const int world_size_;
  const absl::Duration timeout_;
  int rank_ = 0;  // set by Attach
  std::vector<Peer> peers_;
};

}  // namespace shm_internal
}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_SHM_SEGMENT_H_
