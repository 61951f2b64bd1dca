// GlooBackend when a link is cut in the middle of a message: a peer that
// died, or whose reset was lost on a lossy network, after its message had
// partly arrived. Gloo's own error handling (tcp::Pair::signalException)
// wakes the operations it has queued on a pair but not the one whose
// payload is being read or written, so such a collective waits for its
// full timeout even when the connection is known to be closed; Abort()
// must still end it at once.
//
// The cut is made in this process: the test binary defines writev, which
// Gloo's TCP pairs write with (the linker exports it, since libgloo
// refers to it, so libgloo's calls come here), and once armed it lets the
// first large write through only in part and then shuts that socket down
// both ways. Ranks are threads of this process over loopback, as in
// gloo_backend_test. Without AbortableGlooContext the broadcast cases wait
// out Gloo's timeout (the allreduce ones are woken by Gloo itself: another
// receive of theirs is queued on the same buffer).
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "worker/backend/backend.h"
#include "worker/backend/gloo_backend.h"
#include "worker/backend/store.h"
#include "worker/backend/work.h"

namespace gradsync {
namespace {

using ::gradsync::testing::BufferOf;
using ::gradsync::testing::kBound;
using ::gradsync::testing::OptionsFor;
using WritevFn = ssize_t (*)(int, const struct iovec*, int);

// The process's one cut link. Disarmed, every writev goes straight to
// libc. Armed, the first writev of at least `min_bytes` writes half of its
// bytes (or what the socket takes of them), shuts the socket down and
// returns what it wrote; later writevs on that socket fail with EPIPE (as
// on a closed connection, without the signal). Thread-safe.
class CutLink {
 public:
  static CutLink& Get() {
    static CutLink* link = new CutLink();
    return *link;
  }

  void Arm(size_t min_bytes) {
    absl::MutexLock lock(&mu_);
    min_bytes_ = min_bytes;
    fd_ = -1;
  }
  void Disarm() {
    absl::MutexLock lock(&mu_);
    min_bytes_ = 0;
    fd_ = -1;
  }
  // Whether a link was cut within `timeout`.
  bool AwaitCut(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        absl::Condition(
            +[](int* fd) { return *fd >= 0; }, &fd_),
        timeout);
  }

  ssize_t Writev(int fd, const struct iovec* iov, int count) {
    size_t total = 0;
    for (int i = 0; i < count; ++i) total += iov[i].iov_len;
    {
      absl::MutexLock lock(&mu_);
      if (fd >= 0 && fd == fd_) {
        errno = EPIPE;
        return -1;
      }
      if (min_bytes_ > 0 && fd_ < 0 && total >= min_bytes_) {
        const ssize_t written = WriteHalf(fd, iov, count, total);
        if (written > 0) {
          shutdown(fd, SHUT_RDWR);
          fd_ = fd;
        }
        return written;
      }
    }
    return Real()(fd, iov, count);
  }

 private:
  static WritevFn Real() {
    static const WritevFn real =
        reinterpret_cast<WritevFn>(dlsym(RTLD_NEXT, "writev"));
    return real;
  }

  static ssize_t WriteHalf(int fd, const struct iovec* iov, int count,
                           size_t total) {
    std::vector<struct iovec> part;
    size_t left = total / 2;
    for (int i = 0; i < count && left > 0; ++i) {
      const size_t take = std::min(left, iov[i].iov_len);
      part.push_back({iov[i].iov_base, take});
      left -= take;
    }
    return Real()(fd, part.data(), static_cast<int>(part.size()));
  }

  absl::Mutex mu_;
  size_t min_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;  // the cut socket
};

}  // namespace
}  // namespace gradsync

extern "C" ssize_t writev(int fd, const struct iovec* iov, int count) {
  return gradsync::CutLink::Get().Writev(fd, iov, count);
}

namespace gradsync {
namespace {

// Gloo's own timeout, far beyond the test's bound: a collective that ends
// within kBound was ended by the abort.
constexpr absl::Duration kGlooTimeout = absl::Minutes(5);

enum class Collective { kAllReduce, kBroadcast };

class GlooCutLinkTest
    : public ::testing::TestWithParam<std::tuple<Collective, int>> {
 protected:
  void TearDown() override { CutLink::Get().Disarm(); }

  Collective collective() const { return std::get<0>(GetParam()); }
  int world_size() const { return std::get<1>(GetParam()); }
};

// A collective on every rank; a link is cut in the middle of one of its
// messages; every rank's backend is aborted (as the runtime does when the
// coordinator supersedes the round, or the watchdog fires): every rank's
// collective ends within kBound, with an error at both ends of the link.
TEST_P(GlooCutLinkTest, AbortEndsACollectiveWhoseMessageWasCutShort) {
  const int n = world_size();
  InMemoryStore store;
  auto backends = ::gradsync::testing::StartGroup<GlooBackend>(
      n, [&](int rank) {
        return GlooBackend::Create(OptionsFor(rank, n, kGlooTimeout), &store);
      });
  ASSERT_EQ(static_cast<int>(backends.size()), n);

  // 4 MiB a rank: Gloo sends it in messages far above 64 KiB.
  std::vector<std::vector<float>> data(n, std::vector<float>(1 << 20, 1.0f));
  CutLink::Get().Arm(/*min_bytes=*/64 << 10);
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < n; ++r) {
    works.push_back(collective() == Collective::kAllReduce
                        ? backends[r]->AllReduce(BufferOf(data[r]),
                                                 ReduceOp::kSum)
                        : backends[r]->Broadcast(BufferOf(data[r]), 0));
  }
  ASSERT_TRUE(CutLink::Get().AwaitCut(kBound)) << "no message was cut";

  for (auto& backend : backends) backend->Abort();
  int failed = 0;
  for (int r = 0; r < n; ++r) {
    const absl::Status status = works[r]->Wait(kBound);
    ASSERT_TRUE(works[r]->IsCompleted())
        << "rank " << r << "'s collective outlived the abort";
    // A rank the cut link does not feed may have finished before the abort.
    if (status.ok()) continue;
    ++failed;
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable)
        << "rank " << r << ": " << status;
  }
  EXPECT_GE(failed, 2) << "both ends of the cut link fail";
}

INSTANTIATE_TEST_SUITE_P(
    CollectivesAndWorldSizes, GlooCutLinkTest,
    ::testing::Combine(::testing::Values(Collective::kAllReduce,
                                         Collective::kBroadcast),
                       ::testing::Values(2, 3)),
    [](const ::testing::TestParamInfo<std::tuple<Collective, int>>& info) {
      return absl::StrCat(std::get<0>(info.param) == Collective::kAllReduce
                              ? "allreduce"
                              : "broadcast",
                          "_world", std::get<1>(info.param));
    });

}  // namespace
}  // namespace gradsync
