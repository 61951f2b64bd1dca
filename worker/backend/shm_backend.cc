#include "worker/backend/shm_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/reduction.h"
#include "worker/backend/shm_segment.h"

namespace gradsync {
namespace {

using shm_internal::Kind;
using shm_internal::Layout;
using shm_internal::LeaveReason;
using shm_internal::Segment;
using shm_internal::Signature;

// The store key under which rank 0 publishes the segment's name.
constexpr char kNameKey[] = "shm_name";

// The elements [begin, end) of an n-element chunk that `rank` reduces: equal
// shares, each starting on a cache line so that no two ranks write one.
std::pair<size_t, size_t> ShareOf(size_t n, size_t element_bytes, int rank,
                                  int world_size) {
  const size_t per_line = std::max<size_t>(1, 64 / element_bytes);
  const size_t share =
      shm_internal::RoundUp((n + world_size - 1) / world_size, per_line);
  const size_t begin = std::min(n, rank * share);
  return {begin, std::min(n, begin + share)};
}

absl::Status Annotate(const absl::Status& status, const std::string& where,
                      const char* verb) {
  return absl::Status(status.code(),
                      absl::StrCat(where, ": store ", verb, " '", kNameKey,
                                   "' failed: ", status.message()));
}

}  // namespace

// ---------------------------------------------------------------------------
// ShmBackend

absl::StatusOr<std::unique_ptr<ShmBackend>> ShmBackend::Create(
    const BackendOptions& options, Store* store, ShmOptions shm_options) {
  absl::Status valid = CheckBackendOptions(options, "shm backend");
  if (!valid.ok()) return valid;
  if (shm_options.slot_bytes == 0 ||
      shm_options.slot_bytes > shm_internal::kMaxSlotBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm backend: slot_bytes ", shm_options.slot_bytes,
                     " is not in [1, ", shm_internal::kMaxSlotBytes, "]"));
  }
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        "shm backend: no store to bootstrap through");
  }
  const std::string where = absl::StrCat("shm bootstrap (rank ", options.rank,
                                         " of ", options.world_size, ")");
  const Layout layout(
      options.world_size,
      shm_internal::RoundUp(shm_options.slot_bytes, shm_internal::kCacheLine));

  std::unique_ptr<Segment> segment;
  if (options.rank == 0) {
    GS_ASSIGN_OR_RETURN(segment, Segment::Create(layout, options.world_size,
                                                 options.timeout, where));
    absl::Status published = store->Set(kNameKey, segment->name());
    if (!published.ok()) {
      shm_unlink(segment->name().c_str());
      return Annotate(published, where, "set");
    }
  } else {
    absl::StatusOr<std::string> name = store->Get(kNameKey, options.timeout);
    if (!name.ok()) return Annotate(name.status(), where, "get");
    GS_ASSIGN_OR_RETURN(
        segment, Segment::Open(*name, layout, options.world_size, options.rank,
                               options.timeout, where));
  }
  absl::Status attached = segment->Attach(options.rank, where);
  if (attached.ok()) attached = segment->WaitForAll(where, shm_options.cancel);
  // Every rank is in (or the bootstrap failed): the name is no longer needed,
  // and without it nothing is left in /dev/shm however the processes end.
  // Any rank removes it, in case rank 0 died meanwhile.
  shm_unlink(segment->name().c_str());
  if (attached.ok()) attached = segment->WatchPeers(where);
  if (!attached.ok()) {
    segment->Leave(LeaveReason::kGaveUp);
    return attached;
  }
  return std::unique_ptr<ShmBackend>(
      new ShmBackend(options, std::move(segment)));
}

ShmBackend::ShmBackend(const BackendOptions& options,
                       std::unique_ptr<Segment> segment)
    : Backend(options),
      segment_(std::move(segment)),
      queue_("shm", options.rank, options.world_size) {}

ShmBackend::~ShmBackend() {
  // Cancel what has not started, then stop the collective in flight and
  // tell the peers.
  queue_.Shutdown([this] {
    closing_.store(true);
    segment_->Leave(LeaveReason::kDestroyed);
  });
}

void ShmBackend::Abort() {
  closing_.store(true);
  segment_->Leave(LeaveReason::kAborted);
}

const std::string& ShmBackend::segment_name() const { return segment_->name(); }

std::shared_ptr<Work> ShmBackend::AllReduce(Buffer buffer, ReduceOp op) {
  absl::Status valid = CheckBuffer(buffer, DeviceKind::kCpu, "shm allreduce");
  if (!valid.ok()) return Work::Done(0, std::move(valid));
  if (buffer.count == 0) return Enqueue("allreduce", nullptr);
  return Enqueue("allreduce", [this, buffer, op](uint64_t sequence,
                                                 const std::string& where) {
    return RunAllReduce(sequence, where, buffer, op);
  });
}

std::shared_ptr<Work> ShmBackend::Broadcast(Buffer buffer, int root) {
  absl::Status valid = CheckBuffer(buffer, DeviceKind::kCpu, "shm broadcast");
  if (valid.ok()) valid = CheckRoot(root, world_size());
  if (!valid.ok()) return Work::Done(0, std::move(valid));
  if (buffer.count == 0) return Enqueue("broadcast", nullptr);
  return Enqueue("broadcast", [this, buffer, root](uint64_t sequence,
                                                   const std::string& where) {
    return RunBroadcast(sequence, where, buffer, root);
  });
}

std::shared_ptr<Work> ShmBackend::AllGather(Buffer input, Buffer output) {
  absl::Status valid =
      CheckBuffer(input, DeviceKind::kCpu, "shm allgather input");
  if (valid.ok()) {
    valid = CheckBuffer(output, DeviceKind::kCpu, "shm allgather output");
  }
  if (valid.ok()) valid = CheckAllGatherSizes(input, output, world_size());
  if (!valid.ok()) return Work::Done(0, std::move(valid));
  if (input.count == 0) return Enqueue("allgather", nullptr);
  return Enqueue("allgather", [this, input, output](uint64_t sequence,
                                                    const std::string& where) {
    return RunAllGather(sequence, where, input, output);
  });
}

std::shared_ptr<Work> ShmBackend::Barrier() {
  return Enqueue("barrier",
                 [this](uint64_t sequence, const std::string& where) {
                   return RunBarrier(sequence, where);
                 });
}

std::shared_ptr<Work> ShmBackend::Enqueue(const char* collective,
                                          SerialOpQueue::RunFn run) {
  if (!run) return queue_.Enqueue(collective, nullptr);
  return queue_.Enqueue(collective,
                        [this, run = std::move(run)](uint64_t sequence,
                                                     const std::string& where) {
                          absl::Status status = run(sequence, where);
                          // Peers waiting on this rank stop now rather than at
                          // their timeout.
                          if (!status.ok() && !closing_.load())
                            segment_->Leave(LeaveReason::kFailed);
                          return status;
                        });
}

// Each chunk is cut into world_size shares, one reduced by each rank:
//  1. every rank copies its chunk into its slot, but for its own share (which
//     only it reads, from its buffer);
//  2. barrier;
//  3. each rank sums its share over all ranks' inputs into the result slot,
//     block by block, copying each block into its own buffer while it is
//     in cache;
//  4. barrier;
//  5. each rank copies the other shares of the result into its buffer.
// Two barriers per chunk are enough: a rank writes its slot (next chunk or
// collective) only after barrier 2, when every rank has finished reading
// the slots; and it writes the result slot only after the next barrier 1,
// which no rank enters before it has copied the previous result out. Every
// element is reduced by one rank, in rank order, so all get identical bits.
absl::Status ShmBackend::RunAllReduce(uint64_t sequence,
                                      const std::string& where,
                                      const Buffer& buffer, ReduceOp op) {
  // One rank's sum is its own data, and x / 1 == x in every dtype.
  if (world_size() == 1) return absl::OkStatus();
  Segment& segment = *segment_;
  const size_t element_bytes = DataTypeSize(buffer.dtype);
  const size_t chunk = segment.slot_bytes() / element_bytes;
  segment.Begin(sequence,
                Signature{Kind::kAllReduce,
                          static_cast<uint64_t>(op) |
                              static_cast<uint64_t>(buffer.dtype) << 8,
                          buffer.count});
  // Elements reduced and copied back at a time: 32 KiB, which stay in L1.
  const size_t block = (size_t{32} << 10) / element_bytes;
  char* const slot = segment.slot(rank());
  char* const result = segment.result();
  for (size_t first = 0; first < buffer.count; first += chunk) {
    const size_t n = std::min(chunk, buffer.count - first);
    char* const data = static_cast<char*>(buffer.data) + first * element_bytes;
    const auto [begin, end] = ShareOf(n, element_bytes, rank(), world_size());
    // Byte offsets of this rank's share and of the chunk's end.
    const size_t lo = begin * element_bytes;
    const size_t hi = end * element_bytes;
    const size_t size = n * element_bytes;
    std::memcpy(slot, data, lo);
    std::memcpy(slot + hi, data + hi, size - hi);
    GS_RETURN_IF_ERROR(segment.Barrier(where, closing_));
    if (first == 0) GS_RETURN_IF_ERROR(segment.CheckSameCollective(where));
    const reduction::RankInputs inputs{segment.slot(0), segment.slot_bytes(),
                                       world_size(), rank(), data};
    for (size_t i = begin; i < end; i += block) {
      const size_t m = std::min(block, end - i);
      reduction::ReduceRanks(buffer.dtype, inputs, i, m, op,
                             result + i * element_bytes);
      std::memcpy(data + i * element_bytes, result + i * element_bytes,
                  m * element_bytes);
    }
    GS_RETURN_IF_ERROR(segment.Barrier(where, closing_));
    std::memcpy(data, result, lo);
    std::memcpy(data + hi, result + hi, size - hi);
  }
  return absl::OkStatus();
}

// Each chunk: the root copies it into its slot; barrier; the others copy it
// out; barrier (before the root may overwrite the slot).
absl::Status ShmBackend::RunBroadcast(uint64_t sequence,
                                      const std::string& where,
                                      const Buffer& buffer, int root) {
  if (world_size() == 1) return absl::OkStatus();
  Segment& segment = *segment_;
  const size_t bytes = buffer.bytes();
  segment.Begin(sequence, Signature{Kind::kBroadcast,
                                    static_cast<uint64_t>(root), bytes});
  char* data = static_cast<char*>(buffer.data);
  for (size_t first = 0; first < bytes; first += segment.slot_bytes()) {
    const size_t n = std::min(segment.slot_bytes(), bytes - first);
    if (rank() == root) std::memcpy(segment.slot(root), data + first, n);
    GS_RETURN_IF_ERROR(segment.Barrier(where, closing_));
    if (first == 0) GS_RETURN_IF_ERROR(segment.CheckSameCollective(where));
    if (rank() != root) std::memcpy(data + first, segment.slot(root), n);
    GS_RETURN_IF_ERROR(segment.Barrier(where, closing_));
  }
  return absl::OkStatus();
}

// Each round: every rank copies the next slot-sized part of its input into
// its slot; barrier; each copies every slot to its place in the output;
// barrier.
absl::Status ShmBackend::RunAllGather(uint64_t sequence,
                                      const std::string& where,
                                      const Buffer& input,
                                      const Buffer& output) {
  const size_t bytes = input.bytes();
  const char* in = static_cast<const char*>(input.data);
  char* out = static_cast<char*>(output.data);
  if (world_size() == 1) {
    std::memmove(out, in, bytes);
    return absl::OkStatus();
  }
  Segment& segment = *segment_;
  segment.Begin(sequence, Signature{Kind::kAllGather, 0, bytes});
  for (size_t first = 0; first < bytes; first += segment.slot_bytes()) {
    const size_t n = std::min(segment.slot_bytes(), bytes - first);
    std::memcpy(segment.slot(rank()), in + first, n);
    GS_RETURN_IF_ERROR(segment.Barrier(where, closing_));
    if (first == 0) GS_RETURN_IF_ERROR(segment.CheckSameCollective(where));
    for (int r = 0; r < world_size(); ++r) {
      std::memcpy(out + r * bytes + first, segment.slot(r), n);
    }
    GS_RETURN_IF_ERROR(segment.Barrier(where, closing_));
  }
  return absl::OkStatus();
}

absl::Status ShmBackend::RunBarrier(uint64_t sequence,
                                    const std::string& where) {
  if (world_size() == 1) return absl::OkStatus();
  segment_->Begin(sequence);
  return segment_->Barrier(where, closing_);
}

}  // namespace gradsync
