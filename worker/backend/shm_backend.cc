#include "worker/backend/shm_backend.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GRADSYNC_SHM_F16C 1
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <new>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/backend/float16.h"

namespace gradsync {
namespace shm_internal {
namespace {

// The segment (all offsets fixed by the world size and slot size):
//   SegmentHeader                 shared words, each on its own cache line
//   RankRecord x world_size       one cache line per rank, written by it
//   (padding to a page)
//   slot x world_size             rank r's data for the current chunk
//   result slot                   the reduced chunk
constexpr uint64_t kMagic = 0x316d687364617267;  // "gradshm1", little-endian
constexpr uint32_t kVersion = 1;
constexpr size_t kCacheLine = 64;
constexpr size_t kPage = 4096;
constexpr size_t kMaxSlotBytes = size_t{1} << 30;
constexpr char kNameKey[] = "shm_name";

// A waiter spins this many times (a few microseconds) before sleeping on the
// futex: a peer usually arrives within microseconds, but a spinning rank
// takes the core its peer needs on a small machine.
constexpr int kSpins = 200;
// How long a futex sleep lasts before the waiter checks its deadline and
// whether its peers are still alive.
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "atomics in shared memory must be lock-free (address-free)");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "a futex word is a plain 32-bit integer");

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

std::string Describe(const Signature& s, uint64_t sequence) {
  switch (s.kind) {
    case Kind::kAllReduce:
      return absl::StrCat(
          "allreduce #", sequence, " (",
          static_cast<ReduceOp>(s.detail & 0xff) == ReduceOp::kSum ? "sum"
                                                                   : "average",
          " of ", s.count, " ",
          DataTypeName(static_cast<DataType>(s.detail >> 8)), ")");
    case Kind::kBroadcast:
      return absl::StrCat("broadcast #", sequence, " (", s.count,
                          " bytes from rank ", s.detail, ")");
    case Kind::kAllGather:
      return absl::StrCat("allgather #", sequence, " (", s.count,
                          " bytes per rank)");
  }
  return absl::StrCat("collective #", sequence);
}

struct SegmentHeader {
  // Written by rank 0 before it publishes the name; read-only afterwards.
  uint64_t magic;
  uint32_t version;
  uint32_t world_size;
  uint64_t slot_bytes;
  uint64_t total_bytes;
  // Ranks attached so far; a futex word, waited on during bootstrap.
  alignas(kCacheLine) std::atomic<uint32_t> attached;
  // Zero while every rank is in; then the first rank to leave and why:
  // rank + 1 in the low 32 bits, the LeaveReason in the high ones. Set once.
  alignas(kCacheLine) std::atomic<uint64_t> left;
  // The barrier: ranks arrived in the current generation, and the
  // generation, the futex word waiters sleep on.
  alignas(kCacheLine) std::atomic<uint32_t> arrived;
  alignas(kCacheLine) std::atomic<uint32_t> generation;
};

// One per rank, written only by that rank.
struct alignas(kCacheLine) RankRecord {
  // Set when the rank attaches, with the inode of its pid namespace (its pid
  // means something to another rank only in the same namespace).
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> pid_namespace;
  // The last collective it started and the barriers it has entered: what a
  // timeout message says about it.
  std::atomic<uint64_t> sequence;
  std::atomic<uint64_t> barriers;
  // Its current collective's Signature, read by the others after the
  // collective's first barrier and not rewritten before its last one.
  std::atomic<uint64_t> kind;
  std::atomic<uint64_t> detail;
  std::atomic<uint64_t> count;
};

size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

struct Layout {
  Layout(int world_size, size_t slot_bytes)
      : slot_bytes(slot_bytes),
        records(RoundUp(sizeof(SegmentHeader), kCacheLine)),
        slots(RoundUp(records + world_size * sizeof(RankRecord), kPage)),
        total(slots + (world_size + 1) * slot_bytes) {}
  size_t slot_bytes;
  size_t records;  // offset of RankRecord[0]
  size_t slots;    // offset of rank 0's slot
  size_t total;
};

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value,
           const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value,
                 timeout, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  Futex(word, FUTEX_WAKE, INT_MAX, nullptr);
}

// Sleeps while *word == expected, at most `timeout`; may return early.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  Futex(word, FUTEX_WAIT, expected, &ts);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

uint64_t PidNamespace() {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return st.st_ino;
}

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

// Whether the process `pidfd` (from PidfdOpen) refers to has exited.
bool PidfdExited(int pidfd) {
  pollfd poll_fd = {pidfd, POLLIN, 0};
  return poll(&poll_fd, 1, 0) > 0 && (poll_fd.revents & POLLIN) != 0;
}

// Whether process `pid` has exited (a zombie counts, except where pidfds are
// not available).
bool ProcessExited(pid_t pid) {
  const int pidfd = PidfdOpen(pid);
  if (pidfd >= 0) {
    const bool exited = PidfdExited(pidfd);
    close(pidfd);
    return exited;
  }
  if (errno == ESRCH) return true;
  return kill(pid, 0) != 0 && errno == ESRCH;
}

std::string RandomName() {
  std::random_device random;
  const uint64_t bits = (static_cast<uint64_t>(random()) << 32) | random();
  return absl::StrFormat("/gradsync-shm-%d-%016x", getpid(), bits);
}

// A child forked later (a data loader worker, a subprocess) gets no copy of
// the mapping: it could not take part in collectives anyway, and its page
// tables are not copied.
void DoNotInherit(void* base, size_t size) {
  madvise(base, size, MADV_DONTFORK);
}

absl::Status ErrnoStatus(int error, const std::string& message) {
  return absl::ErrnoToStatus(error, message);
}

}  // namespace

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

  ~Segment() {
    for (const Peer& peer : peers_) {
      if (peer.pidfd >= 0) close(peer.pidfd);
    }
    munmap(base_, layout_.total);
  }
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
  void Begin(uint64_t sequence) {
    Mine().sequence.store(sequence, std::memory_order_relaxed);
  }
  void Begin(uint64_t sequence, const Signature& signature) {
    Begin(sequence);
    RankRecord& me = Mine();
    me.kind.store(static_cast<uint64_t>(signature.kind),
                  std::memory_order_relaxed);
    me.detail.store(signature.detail, std::memory_order_relaxed);
    me.count.store(signature.count, std::memory_order_relaxed);
  }
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

  SegmentHeader& header() const {
    return *reinterpret_cast<SegmentHeader*>(base_);
  }
  RankRecord& record(int rank) const {
    return reinterpret_cast<RankRecord*>(base_ + layout_.records)[rank];
  }
  RankRecord& Mine() const { return record(rank_); }

  Signature SignatureOf(int rank) const {
    const RankRecord& r = record(rank);
    Signature s;
    s.kind = static_cast<Kind>(r.kind.load(std::memory_order_relaxed));
    s.detail = r.detail.load(std::memory_order_relaxed);
    s.count = r.count.load(std::memory_order_relaxed);
    return s;
  }

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

absl::StatusOr<std::unique_ptr<Segment>> Segment::Create(
    const Layout& layout, int world_size, absl::Duration timeout,
    const std::string& where) {
  std::string name;
  int fd = -1;
  // A name clash with a live segment is all but impossible; retry anyway.
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name = RandomName();
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    const int error = errno;
    if (fd < 0 && error != EEXIST) {
      return ErrnoStatus(
          error, absl::StrCat(where, ": cannot create shared-memory segment '",
                              name, "'"));
    }
  }
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(
        where,
        ": cannot create a shared-memory segment: every name tried "
        "exists"));
  }
  auto fail = [&](absl::Status status) {
    close(fd);
    shm_unlink(name.c_str());
    return status;
  };
  if (ftruncate(fd, static_cast<off_t>(layout.total)) != 0) {
    const int error = errno;
    return fail(ErrnoStatus(
        error, absl::StrCat(where, ": cannot size shared-memory segment '",
                            name, "' to ", layout.total, " bytes")));
  }
  // Reserve the memory now: a tmpfs that runs out while a collective first
  // touches a page raises SIGBUS instead of returning an error.
  const int reserved = posix_fallocate(fd, 0, static_cast<off_t>(layout.total));
  if (reserved != 0 && reserved != EOPNOTSUPP && reserved != EINVAL) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        where, ": cannot reserve ", layout.total,
        " bytes of shared memory for segment '", name,
        "': ", std::strerror(reserved),
        " (make ShmOptions::slot_bytes smaller or /dev/shm larger)")));
  }
  void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    return fail(ErrnoStatus(
        error, absl::StrCat(where, ": cannot map shared-memory segment '", name,
                            "' of ", layout.total, " bytes")));
  }
  close(fd);
  DoNotInherit(base, layout.total);
  // The file starts zeroed; construct the header's atomics in place.
  SegmentHeader* header = new (base) SegmentHeader();
  header->magic = kMagic;
  header->version = kVersion;
  header->world_size = static_cast<uint32_t>(world_size);
  header->slot_bytes = layout.slot_bytes;
  header->total_bytes = layout.total;
  auto* records = static_cast<char*>(base) + layout.records;
  for (int r = 0; r < world_size; ++r) {
    new (records + r * sizeof(RankRecord)) RankRecord();
  }
  return std::unique_ptr<Segment>(new Segment(
      std::move(name), static_cast<char*>(base), layout, world_size, timeout));
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Open(
    const std::string& name, const Layout& layout, int world_size, int rank,
    absl::Duration timeout, const std::string& where) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          where, ": shared-memory segment '", name,
          "' that rank 0 published does not exist: is every rank on one "
          "host, sharing /dev/shm? (or rank 0 gave up already)"));
    }
    return ErrnoStatus(
        error, absl::StrCat(where, ": cannot open shared-memory segment '",
                            name, "'"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoStatus(error,
                       absl::StrCat(where, ": cannot stat '", name, "'"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < sizeof(SegmentHeader)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": '", name, "' is not a gradsync shm segment (",
                     size, " bytes)"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, fd, 0);
  const int error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    return ErrnoStatus(error, absl::StrCat(where, ": cannot map '", name,
                                           "' of ", size, " bytes"));
  }
  DoNotInherit(base, size);
  auto* header = static_cast<SegmentHeader*>(base);
  absl::Status mismatch;
  if (header->magic != kMagic || header->version != kVersion) {
    mismatch = absl::FailedPreconditionError(
        absl::StrCat(where, ": '", name,
                     "' is not a gradsync shm segment of version ", kVersion));
  } else if (header->world_size != static_cast<uint32_t>(world_size) ||
             header->slot_bytes != layout.slot_bytes ||
             header->total_bytes != size || size != layout.total) {
    mismatch = absl::InvalidArgumentError(absl::StrCat(
        where, ": rank 0 made the segment for ", header->world_size,
        " ranks with ", header->slot_bytes, "-byte slots; this rank has ",
        world_size, " ranks with ", layout.slot_bytes,
        "-byte slots (every rank must pass the same world size and "
        "ShmOptions)"));
  }
  if (mismatch.code() == absl::StatusCode::kInvalidArgument) {
    uint64_t nobody = 0;
    header->left.compare_exchange_strong(
        nobody, (static_cast<uint64_t>(LeaveReason::kGaveUp) << 32) |
                    static_cast<uint64_t>(rank + 1));
    FutexWakeAll(&header->attached);
  }
  if (!mismatch.ok()) {
    munmap(base, size);
    return mismatch;
  }
  return std::unique_ptr<Segment>(
      new Segment(name, static_cast<char*>(base), layout, world_size, timeout));
}

absl::Status Segment::Attach(int rank, const std::string& where) {
  rank_ = rank;
  RankRecord& me = Mine();
  int32_t nobody = 0;
  if (!me.pid.compare_exchange_strong(nobody, getpid())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": rank ", rank, " has attached already (pid ",
                     nobody, "): two processes were given the same rank"));
  }
  // Read by the others once they see every rank attached.
  me.pid_namespace.store(PidNamespace(), std::memory_order_relaxed);
  header().attached.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&header().attached);
  return absl::OkStatus();
}

absl::Status Segment::WaitForAll(const std::string& where,
                                 const std::atomic<bool>* cancel) {
  const absl::Time deadline = absl::Now() + timeout_;
  std::atomic<uint32_t>& attached = header().attached;
  bool slept = false;
  for (;;) {
    const uint32_t count = attached.load(std::memory_order_acquire);
    if (count == static_cast<uint32_t>(world_size_)) return absl::OkStatus();
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(
          absl::StrCat(where, ": cancelled while ", count, " of ", world_size_,
                       " ranks had attached"));
    }
    const absl::Time now = absl::Now();
    if (now < deadline) {
      GS_RETURN_IF_ERROR(CheckNobodyLeft(where));
      if (slept) GS_RETURN_IF_ERROR(CheckAttachedAlive(where));
    } else {
      std::vector<int> missing;
      for (int r = 0; r < world_size_; ++r) {
        if (record(r).pid.load(std::memory_order_relaxed) == 0) {
          missing.push_back(r);
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": ", count, " of ", world_size_, " ranks attached within ",
          absl::FormatDuration(timeout_), "; missing: rank ",
          absl::StrJoin(missing, ", "),
          " (check that every rank of the round runs on this host and "
          "creates its shm backend)"));
    }
    FutexWait(&attached, count, std::min(kPollInterval, deadline - now));
    slept = true;
  }
}

absl::Status Segment::CheckAttachedAlive(const std::string& where) const {
  const pid_t self = getpid();
  const uint64_t self_namespace = PidNamespace();
  for (int r = 0; r < world_size_; ++r) {
    const RankRecord& peer = record(r);
    const pid_t pid = peer.pid.load(std::memory_order_acquire);
    if (pid == 0 || pid == self ||
        peer.pid_namespace.load(std::memory_order_relaxed) != self_namespace) {
      continue;
    }
    if (ProcessExited(pid)) {
      return absl::UnavailableError(
          absl::StrCat(where, ": rank ", r, " (pid ", pid, ") exited"));
    }
  }
  return absl::OkStatus();
}

absl::Status Segment::WatchPeers(const std::string& where) {
  const pid_t self = getpid();
  const uint64_t self_namespace = PidNamespace();
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    Peer peer;
    peer.rank = r;
    peer.pid = record(r).pid.load(std::memory_order_relaxed);
    const uint64_t ns = record(r).pid_namespace.load(std::memory_order_relaxed);
    peer.watched = peer.pid != self && ns == self_namespace;
    if (peer.watched) {
      peer.pidfd = PidfdOpen(peer.pid);
      if (peer.pidfd < 0 && errno == ESRCH) {
        return absl::UnavailableError(
            absl::StrCat(where, ": rank ", r, " (pid ", peer.pid, ") exited"));
      }
      // Without pidfds (an old kernel, a seccomp filter), kill(pid, 0).
    }
    peers_.push_back(peer);
  }
  return absl::OkStatus();
}

absl::Status Segment::CheckSameCollective(const std::string& where) const {
  const Signature mine = SignatureOf(rank_);
  const uint64_t sequence = Mine().sequence.load(std::memory_order_relaxed);
  for (int r = 0; r < world_size_; ++r) {
    const Signature theirs = SignatureOf(r);
    const uint64_t their_sequence =
        record(r).sequence.load(std::memory_order_relaxed);
    if (theirs == mine && their_sequence == sequence) continue;
    return absl::InternalError(absl::StrCat(
        where, ": the ranks issued different collectives: this rank ",
        Describe(mine, sequence), ", rank ", r, " ",
        Describe(theirs, their_sequence),
        " (every rank must issue the same collectives in the same order)"));
  }
  return absl::OkStatus();
}

absl::Status Segment::Barrier(const std::string& where,
                              const std::atomic<bool>& closing) {
  if (closing.load()) {
    return absl::CancelledError(absl::StrCat(
        where, ": cancelled: the backend was aborted or destroyed"));
  }
  GS_RETURN_IF_ERROR(CheckNobodyLeft(where));
  SegmentHeader& h = header();
  RankRecord& me = Mine();
  const uint64_t barrier = me.barriers.load(std::memory_order_relaxed) + 1;
  me.barriers.store(barrier, std::memory_order_relaxed);
  // The generation cannot move before this rank arrives.
  const uint32_t generation = h.generation.load(std::memory_order_acquire);
  if (h.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(world_size_)) {
    // Last to arrive: reset the count for the next barrier, then release
    // everyone (they read the count only after seeing the new generation).
    h.arrived.store(0, std::memory_order_relaxed);
    h.generation.store(generation + 1, std::memory_order_release);
    FutexWakeAll(&h.generation);
    return absl::OkStatus();
  }
  auto passed = [&] {
    return h.generation.load(std::memory_order_acquire) != generation;
  };
  for (int i = 0; i < kSpins; ++i) {
    if (passed()) return absl::OkStatus();
    CpuRelax();
  }
  const absl::Time deadline = absl::Now() + timeout_;
  bool slept = false;
  for (;;) {
    if (passed()) return absl::OkStatus();
    absl::Status status;
    if (closing.load()) {
      status = absl::CancelledError(absl::StrCat(
          where, ": cancelled: the backend was aborted or destroyed while it "
                 "ran"));
    } else if (status = CheckNobodyLeft(where); status.ok() && slept) {
      // Every poll interval: has a peer's process exited?
      status = CheckPeersAlive(where);
    }
    // A peer that completed the barrier and then left or exited was in
    // time: it released the barrier before it left.
    if (!status.ok()) return passed() ? absl::OkStatus() : status;
    const absl::Time now = absl::Now();
    if (now >= deadline) return BarrierTimeout(where, barrier);
    FutexWait(&h.generation, generation,
              std::min(kPollInterval, deadline - now));
    slept = true;
  }
}

void Segment::Leave(LeaveReason reason) {
  uint64_t nobody = 0;
  header().left.compare_exchange_strong(
      nobody,
      (static_cast<uint64_t>(reason) << 32) | static_cast<uint64_t>(rank_ + 1));
  FutexWakeAll(&header().generation);
  FutexWakeAll(&header().attached);
}

absl::Status Segment::CheckNobodyLeft(const std::string& where) const {
  const uint64_t left = header().left.load(std::memory_order_acquire);
  if (left == 0) return absl::OkStatus();
  const int rank = static_cast<int>(left & 0xffffffffu) - 1;
  // (A rank that was given another world size may be past our records, and
  // one that failed to open the segment never recorded its pid.)
  const int32_t pid_value =
      rank < world_size_ ? record(rank).pid.load(std::memory_order_relaxed) : 0;
  const std::string pid =
      pid_value != 0 ? absl::StrCat(" (pid ", pid_value, ")") : "";
  const char* why = "";
  switch (static_cast<LeaveReason>(left >> 32)) {
    case LeaveReason::kDestroyed:
      why = "its backend was destroyed";
      break;
    case LeaveReason::kFailed:
      why = "a collective failed on it";
      break;
    case LeaveReason::kGaveUp:
      why = "its bootstrap failed";
      break;
    case LeaveReason::kAborted:
      why = "its process group was aborted";
      break;
  }
  return absl::UnavailableError(
      absl::StrCat(where, ": rank ", rank, pid, " left the group: ", why));
}

absl::Status Segment::CheckPeersAlive(const std::string& where) const {
  for (const Peer& peer : peers_) {
    if (!peer.watched) continue;
    bool exited = false;
    if (peer.pidfd >= 0) {
      exited = PidfdExited(peer.pidfd);
    } else {
      exited = kill(peer.pid, 0) != 0 && errno == ESRCH;
    }
    if (exited) {
      return absl::UnavailableError(absl::StrCat(
          where, ": rank ", peer.rank, " (pid ", peer.pid, ") exited"));
    }
  }
  return absl::OkStatus();
}

absl::Status Segment::BarrierTimeout(const std::string& where,
                                     uint64_t barrier) const {
  std::vector<std::string> missing;
  for (int r = 0; r < world_size_; ++r) {
    const RankRecord& peer = record(r);
    if (peer.barriers.load(std::memory_order_relaxed) >= barrier) continue;
    missing.push_back(absl::StrCat(
        "rank ", r, " (pid ", peer.pid.load(std::memory_order_relaxed),
        ", last started collective #",
        peer.sequence.load(std::memory_order_relaxed), ")"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      where, ": timed out: ",
      missing.empty()
          ? "the barrier did not complete"
          : absl::StrCat(absl::StrJoin(missing, ", "), " did not take part"),
      " within ", absl::FormatDuration(timeout_),
      " (check that every rank issues the same collectives in the same order "
      "and is alive)"));
}

}  // namespace shm_internal

namespace {

using shm_internal::Kind;
using shm_internal::Layout;
using shm_internal::LeaveReason;
using shm_internal::Segment;
using shm_internal::Signature;

// ---------------------------------------------------------------------------
// Reduction kernels. Plain loops over restrict pointers in blocks of a fixed
// number of elements, so that the compiler vectorizes them even under -O2's
// cheapest cost model; integers are summed as their unsigned type, so that
// overflow wraps around instead of being undefined.

constexpr size_t kLanes = 16;

template <typename T, bool = std::is_integral_v<T>>
struct SumTypeOf {
  using type = T;
};
template <typename T>
struct SumTypeOf<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename T>
using SumType = typename SumTypeOf<T>::type;

template <typename U>
void Add(U* __restrict out, const U* __restrict a, const U* __restrict b,
         size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      out[i + j] = static_cast<U>(a[i + j] + b[i + j]);
    }
  }
  for (; i < n; ++i) out[i] = static_cast<U>(a[i] + b[i]);
}

template <typename U>
void AddInPlace(U* __restrict out, const U* __restrict a, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      out[i + j] = static_cast<U>(out[i + j] + a[i + j]);
    }
  }
  for (; i < n; ++i) out[i] = static_cast<U>(out[i] + a[i]);
}

// Divides by the world size: floats exactly as `/` rounds (as Gloo does),
// integers truncating toward zero.
template <typename T>
void DivideInPlace(T* __restrict data, size_t n, int world_size) {
  const T divisor = static_cast<T>(world_size);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      data[i + j] = static_cast<T>(data[i + j] / divisor);
    }
  }
  for (; i < n; ++i) data[i] = static_cast<T>(data[i] / divisor);
}

// Where each rank's input for the current chunk lies: rank r's in its slot,
// `base` + r * `stride`, except this rank's, which it reads from its own
// buffer (`own`).
struct Slots {
  const char* base;
  size_t stride;
  int count;
  int own_rank;
  const char* own;
  template <typename T>
  const T* at(int rank, size_t first) const {
    return reinterpret_cast<const T*>(rank == own_rank ? own
                                                       : base + rank * stride) +
           first;
  }
};

// out[i] = sum over ranks of in[rank][first + i] (divided by the world size
// for kAverage), for i in [0, n).
template <typename T>
void Reduce(const Slots& in, size_t first, size_t n, ReduceOp op, T* out) {
  using U = SumType<T>;
  U* sum = reinterpret_cast<U*>(out);
  if (in.count == 1) {
    std::memcpy(sum, in.at<U>(0, first), n * sizeof(U));
  } else {
    Add(sum, in.at<U>(0, first), in.at<U>(1, first), n);
    for (int r = 2; r < in.count; ++r) AddInPlace(sum, in.at<U>(r, first), n);
  }
  if (op == ReduceOp::kAverage) DivideInPlace(out, n, in.count);
}

// The 16-bit floats: summed in float, in blocks, rounded once. `kFull`
// blocks have a size known at compile time, so their loops vectorize.
constexpr size_t kBlock16 = 256;

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), bool kFull>
void ReduceBlock16(const Slots& in, size_t first, size_t size, ReduceOp op,
                   uint16_t* __restrict out) {
  const size_t m = kFull ? kBlock16 : size;
  float sum[kBlock16];
  const uint16_t* __restrict a = in.at<uint16_t>(0, first);
  for (size_t j = 0; j < m; ++j) sum[j] = ToFloat(a[j]);
  for (int r = 1; r < in.count; ++r) {
    const uint16_t* __restrict b = in.at<uint16_t>(r, first);
    for (size_t j = 0; j < m; ++j) sum[j] += ToFloat(b[j]);
  }
  if (op == ReduceOp::kAverage) {
    const float divisor = static_cast<float>(in.count);
    for (size_t j = 0; j < m; ++j) sum[j] /= divisor;
  }
  for (size_t j = 0; j < m; ++j) out[j] = FromFloat(sum[j]);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Reduce16(const Slots& in, size_t first, size_t n, ReduceOp op,
              uint16_t* out) {
  size_t i = 0;
  for (; i + kBlock16 <= n; i += kBlock16) {
    ReduceBlock16<ToFloat, FromFloat, true>(in, first + i, kBlock16, op,
                                            out + i);
  }
  if (i < n) {
    ReduceBlock16<ToFloat, FromFloat, false>(in, first + i, n - i, op, out + i);
  }
}

#ifdef GRADSYNC_SHM_F16C
// float16 with the F16C instructions, 8 conversions each, where the CPU has
// them (compiled for it whatever the build's target): the same results as
// Reduce16, several times faster.
__attribute__((target("avx,f16c"))) void ReduceFloat16WithF16c(
    const Slots& in, size_t first, size_t n, ReduceOp op, uint16_t* out) {
  const __m256 divisor = _mm256_set1_ps(static_cast<float>(in.count));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 sum = _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(in.at<uint16_t>(0, first + i))));
    for (int r = 1; r < in.count; ++r) {
      sum = _mm256_add_ps(
          sum, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                   in.at<uint16_t>(r, first + i)))));
    }
    if (op == ReduceOp::kAverage) sum = _mm256_div_ps(sum, divisor);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    Reduce16<Float16ToFloat, FloatToFloat16>(in, first + i, n - i, op, out + i);
  }
}

bool HaveF16c() {
  static const bool have =
      __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return have;
}
#endif

void ReduceAny(DataType dtype, const Slots& in, size_t first, size_t n,
               ReduceOp op, void* out) {
  switch (dtype) {
    case DataType::kFloat32:
      return Reduce(in, first, n, op, static_cast<float*>(out));
    case DataType::kFloat64:
      return Reduce(in, first, n, op, static_cast<double*>(out));
    case DataType::kInt32:
      return Reduce(in, first, n, op, static_cast<int32_t*>(out));
    case DataType::kInt64:
      return Reduce(in, first, n, op, static_cast<int64_t*>(out));
    case DataType::kUInt8:
      return Reduce(in, first, n, op, static_cast<uint8_t*>(out));
    case DataType::kFloat16:
#ifdef GRADSYNC_SHM_F16C
      if (HaveF16c()) {
        return ReduceFloat16WithF16c(in, first, n, op,
                                     static_cast<uint16_t*>(out));
      }
#endif
      return Reduce16<Float16ToFloat, FloatToFloat16>(
          in, first, n, op, static_cast<uint16_t*>(out));
    case DataType::kBFloat16:
      return Reduce16<BFloat16ToFloat, FloatToBFloat16>(
          in, first, n, op, static_cast<uint16_t*>(out));
  }
  GS_CHECK(false) << "unknown dtype " << static_cast<int>(dtype);
}

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
  return absl::Status(
      status.code(),
      absl::StrCat(where, ": store ", verb, " '", shm_internal::kNameKey,
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
    absl::Status published =
        store->Set(shm_internal::kNameKey, segment->name());
    if (!published.ok()) {
      shm_unlink(segment->name().c_str());
      return Annotate(published, where, "set");
    }
  } else {
    absl::StatusOr<std::string> name =
        store->Get(shm_internal::kNameKey, options.timeout);
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
    const Slots inputs{segment.slot(0), segment.slot_bytes(), world_size(),
                       rank(), data};
    for (size_t i = begin; i < end; i += block) {
      const size_t m = std::min(block, end - i);
      ReduceAny(buffer.dtype, inputs, i, m, op, result + i * element_bytes);
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
