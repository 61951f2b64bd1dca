// absl::Mutex's lock-order check as ConfigureMutexChecks leaves it (the
// test main calls it, as every gradsync main does): mutexes destroyed and
// made again at the same addresses, taken in the opposite order, do not
// abort the process. On Debian 13's abseil (20240722) with this code built
// with NDEBUG, the second order closed a cycle through the destroyed
// mutexes' stale entries and aborted ("Potential Mutex deadlock"); with
// Debian 12's abseil the check stays on and the same sequence passes.
#include "common/mutex_checks.h"

#include <new>

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(MutexChecksTest, SoundOnlyWhereDestroyedMutexesLeaveTheGraph) {
#if defined(NDEBUG) && defined(ABSL_LTS_RELEASE_VERSION) && \
    ABSL_LTS_RELEASE_VERSION < 20240116
  EXPECT_TRUE(MutexOrderCheckIsSound());
#elif defined(NDEBUG)
  EXPECT_FALSE(MutexOrderCheckIsSound());
#else
  EXPECT_TRUE(MutexOrderCheckIsSound());
#endif
}

TEST(MutexChecksTest, MutexesRemadeAtTheSameAddressesTakeAnyOrder) {
  ConfigureMutexChecks();  // as the test main did; idempotent
  alignas(absl::Mutex) unsigned char first[sizeof(absl::Mutex)];
  alignas(absl::Mutex) unsigned char second[sizeof(absl::Mutex)];
  for (int order = 0; order < 2; ++order) {
    auto* a = new (first) absl::Mutex;
    auto* b = new (second) absl::Mutex;
    absl::Mutex* outer = order == 0 ? a : b;
    absl::Mutex* inner = order == 0 ? b : a;
    outer->Lock();
    inner->Lock();
    inner->Unlock();
    outer->Unlock();
    a->~Mutex();
    b->~Mutex();
  }
  SUCCEED();  // the process is still here
}

}  // namespace
}  // namespace gradsync
