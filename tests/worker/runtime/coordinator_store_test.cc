// CoordinatorStore on a fake coordinator: keys carry the store's prefix in
// its round's scope, Get waits for a key (DEADLINE_EXCEEDED after its
// timeout), and stores of other prefixes or rounds do not see each other.
#include "worker/runtime/coordinator_store.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_coordinator_client.h"

namespace gradsync {
namespace {

v1::Scope Round(int64_t round) {
  v1::Scope scope;
  scope.set_job_id("store-job");
  scope.set_round(round);
  return scope;
}

TEST(CoordinatorStoreTest, KeysAreThePrefixsInTheRoundsScope) {
  FakeCoordinatorClient fake;
  CoordinatorStore store(&fake, Round(3), "gloo/");
  ASSERT_TRUE(store.Set("rank0", "address").ok());
  EXPECT_EQ(*fake.Get(Round(3), "gloo/rank0"), "address");
  EXPECT_EQ(*store.Get("rank0", absl::Seconds(1)), "address");

  CoordinatorStore other_prefix(&fake, Round(3), "nccl/");
  CoordinatorStore other_round(&fake, Round(4), "gloo/");
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      other_prefix.Get("rank0", absl::Milliseconds(10)).status()));
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      other_round.Get("rank0", absl::Milliseconds(10)).status()));
}

TEST(CoordinatorStoreTest, GetAndWaitBlockUntilTheKeysAreSet) {
  FakeCoordinatorClient fake;
  CoordinatorStore reader(&fake, Round(1), "p/");
  CoordinatorStore writer(&fake, Round(1), "p/");
  std::thread set_later([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(writer.Set("a", "1").ok());
    ASSERT_TRUE(writer.Set("b", "2").ok());
  });
  absl::StatusOr<std::string> a = reader.Get("a", absl::Seconds(30));
  EXPECT_TRUE(reader.Wait({"a", "b"}, absl::Seconds(30)).ok());
  set_later.join();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "1");
}

TEST(CoordinatorStoreTest, TheCoordinatorsErrorsAreReturned) {
  FakeCoordinatorClient fake;
  CoordinatorStore store(&fake, Round(1), "p/");
  fake.FailNext("Set", absl::AbortedError("round 1 was superseded"));
  const absl::Status set = store.Set("a", "1");
  EXPECT_TRUE(absl::IsAborted(set)) << set;
  EXPECT_EQ(set.message(), "round 1 was superseded");
}

}  // namespace
}  // namespace gradsync
