#include "worker/backend/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/backend/backend.h"

namespace gradsync {
namespace shm_internal {

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

namespace {

constexpr uint64_t kMagic = 0x316d687364617267;  // "gradshm1", little-endian
constexpr uint32_t kVersion = 1;
constexpr size_t kPage = 4096;

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

// Creates a shared-memory object under a new random name (set in `*name`)
// and returns its descriptor.
absl::StatusOr<int> CreateWithNewName(const std::string& where,
                                      std::string* name) {
  int fd = -1;
  // A name clash with a live segment is all but impossible; retry anyway.
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    *name = RandomName();
    fd = shm_open(name->c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    const int error = errno;
    if (fd < 0 && error != EEXIST) {
      return ErrnoStatus(
          error, absl::StrCat(where, ": cannot create shared-memory segment '",
                              *name, "'"));
    }
  }
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(
        where,
        ": cannot create a shared-memory segment: every name tried "
        "exists"));
  }
  return fd;
}

// Maps the whole of the existing segment `name` and sets `*size_out` to its
// size; FAILED_PRECONDITION if it is too small to be a segment.
absl::StatusOr<void*> MapExisting(const std::string& name,
                                  const std::string& where, size_t* size_out) {
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
  *size_out = size;
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
  return base;
}

}  // namespace

Layout::Layout(int world_size, size_t slot_bytes)
    : slot_bytes(slot_bytes),
      records(RoundUp(sizeof(SegmentHeader), kCacheLine)),
      slots(RoundUp(records + world_size * sizeof(RankRecord), kPage)),
      total(slots + (world_size + 1) * slot_bytes) {}

Segment::~Segment() {
  for (const Peer& peer : peers_) {
    if (peer.pidfd >= 0) close(peer.pidfd);
  }
  munmap(base_, layout_.total);
}

SegmentHeader& Segment::header() const {
  return *reinterpret_cast<SegmentHeader*>(base_);
}

RankRecord& Segment::record(int rank) const {
  return reinterpret_cast<RankRecord*>(base_ + layout_.records)[rank];
}

Signature Segment::SignatureOf(int rank) const {
  const RankRecord& r = record(rank);
  Signature s;
  s.kind = static_cast<Kind>(r.kind.load(std::memory_order_relaxed));
  s.detail = r.detail.load(std::memory_order_relaxed);
  s.count = r.count.load(std::memory_order_relaxed);
  return s;
}

void Segment::Begin(uint64_t sequence) {
  Mine().sequence.store(sequence, std::memory_order_relaxed);
}

void Segment::Begin(uint64_t sequence, const Signature& signature) {
  Begin(sequence);
  RankRecord& me = Mine();
  me.kind.store(static_cast<uint64_t>(signature.kind),
                std::memory_order_relaxed);
  me.detail.store(signature.detail, std::memory_order_relaxed);
  me.count.store(signature.count, std::memory_order_relaxed);
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Create(
    const Layout& layout, int world_size, absl::Duration timeout,
    const std::string& where) {
  std::string name;
  GS_ASSIGN_OR_RETURN(const int fd, CreateWithNewName(where, &name));
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
  size_t size = 0;
  GS_ASSIGN_OR_RETURN(void* const base, MapExisting(name, where, &size));
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
}  // namespace gradsync
