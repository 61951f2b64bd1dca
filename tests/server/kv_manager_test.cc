#include "server/kv_manager.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"
#include "server/job_manager.h"
#include "server/storage/in_memory_storage.h"
#include "tests/testing/outcome.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;

constexpr char kJob[] = "train";

// The outcome of a Wait.
class WaitOutcome : public Outcome<absl::Status> {
 public:
  absl::Status status() const { return result(); }
};

class KvManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::JobConfig config;
    config.set_job_id(kJob);
    ASSERT_TRUE(jobs_.Create(config).ok());
    kv_->OpenRound(kJob, 1);
  }

  // Rebuilds the manager with other limits (keeps the jobs and round 1).
  void UseLimits(KvLimits limits) {
    kv_ = std::make_unique<KvManager>(&storage_, &clock_, &jobs_, limits);
    kv_->OpenRound(kJob, 1);
  }

  void Set(const std::string& key, const std::string& value) {
    ASSERT_TRUE(kv_->Set(scope_, key, value).ok()) << key;
  }

  InMemoryStorage storage_;
  FakeClock clock_;
  JobManager jobs_{&storage_, &clock_};
  std::unique_ptr<KvManager> kv_ =
      std::make_unique<KvManager>(&storage_, &clock_, &jobs_);
  const KvScope scope_{kJob, 1};
};

// ---------------------------------------------------------------------------
// Request ids: Add and CompareAndSet applied at most once per id

TEST_F(KvManagerTest, AnAddRetriedWithItsRequestIdIsAnsweredAsTheFirst) {
  ASSERT_EQ(kv_->Add(scope_, "n", 5, "r1").value(), 5);
  ASSERT_EQ(kv_->Add(scope_, "n", 1).value(), 6);  // another caller's
  EXPECT_EQ(kv_->Add(scope_, "n", 5, "r1").value(), 5);
  EXPECT_EQ(kv_->Get(scope_, "n").value(), "6");
  EXPECT_EQ(kv_->Add(scope_, "n", 5, "r2").value(), 11);  // a fresh id adds
}

TEST_F(KvManagerTest, ARequestIdIsStoredWithItsWriteAndGoesWithTheRound) {
  ASSERT_TRUE(kv_->Add(scope_, "n", 2, "r1").ok());
  ASSERT_TRUE(kv_->CompareAndSet(scope_, "k", "", true, "v", "r2").ok());
  EXPECT_THAT(storage_.Scan("kvreq/", /*keys_only=*/false).value(),
              ElementsAre(Pair("kvreq/train/1/r1", "add 2 n"),
                          Pair("kvreq/train/1/r2", "cas k")));
  kv_->OpenRound(kJob, 2);
  EXPECT_THAT(storage_.Scan("kvreq/", /*keys_only=*/true).value(), IsEmpty());
  const KvScope round2{kJob, 2};
  EXPECT_EQ(kv_->Add(round2, "n", 2, "r1").value(), 2);  // a new round's
}

TEST_F(KvManagerTest, ACasRetriedAfterItSwappedAnswersSwappedWithoutComparing) {
  CasResult first = kv_->CompareAndSet(scope_, "k", "", true, "mine", "r1").value();
  ASSERT_TRUE(first.swapped);
  // The retry's comparison (absent) would now fail: it is not made again.
  CasResult retry = kv_->CompareAndSet(scope_, "k", "", true, "mine", "r1").value();
  EXPECT_TRUE(retry.swapped);
  EXPECT_TRUE(retry.exists);
  EXPECT_EQ(retry.value, "mine");
  // Without the id the same call compares, and does not swap.
  EXPECT_FALSE(kv_->CompareAndSet(scope_, "k", "", true, "mine").value().swapped);
}

TEST_F(KvManagerTest, ACasThatDidNotSwapIsNotRememberedAndComparesAgain) {
  Set("k", "a");
  ASSERT_FALSE(kv_->CompareAndSet(scope_, "k", "b", false, "c", "r1").value().swapped);
  Set("k", "b");
  EXPECT_TRUE(kv_->CompareAndSet(scope_, "k", "b", false, "c", "r1").value().swapped);
  EXPECT_EQ(kv_->Get(scope_, "k").value(), "c");
}

TEST_F(KvManagerTest, ARequestIdReusedForAnotherCallIsInvalidArgument) {
  ASSERT_TRUE(kv_->Add(scope_, "n", 1, "r1").ok());
  absl::StatusOr<int64_t> other_key = kv_->Add(scope_, "m", 1, "r1");
  EXPECT_EQ(other_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other_key.status().message(), HasSubstr("fresh id"));
  EXPECT_EQ(kv_->CompareAndSet(scope_, "n", "1", false, "2", "r1").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_->Get(scope_, "n").value(), "1");
  EXPECT_FALSE(kv_->Get(scope_, "m").ok());
}

TEST_F(KvManagerTest, ABadRequestIdIsInvalidArgumentAndChangesNothing) {
  for (const std::string& id :
       {std::string("has space"), std::string("a/b"), std::string(65, 'x'),
        std::string("\xff")}) {
    absl::StatusOr<int64_t> added = kv_->Add(scope_, "n", 1, id);
    EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(added.status().message(), HasSubstr("request id")) << id;
  }
  EXPECT_FALSE(kv_->Get(scope_, "n").ok());
  EXPECT_TRUE(kv_->Add(scope_, "n", 1, std::string(64, 'x')).ok());
}

TEST_F(KvManagerTest, RequestRecordsCountAgainstTheRoundsBytes) {
  KvLimits limits;
  limits.max_bytes_per_round = 40;
  UseLimits(limits);
  ASSERT_TRUE(kv_->Add(scope_, "n", 1).ok());  // 2 bytes
  // key 1 + value 1 + record key "kvreq/train/1/" + 20 + "add 2 n"
  EXPECT_EQ(kv_->Add(scope_, "n", 1, std::string(20, 'r')).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv_->Get(scope_, "n").value(), "1");
}

// ---------------------------------------------------------------------------
// Set / Get / Delete / List

TEST_F(KvManagerTest, GetReturnsWhatSetStored) {
  ASSERT_TRUE(kv_->Set(scope_, "addr", "10.0.0.5:29500").ok());
  absl::StatusOr<std::string> value = kv_->Get(scope_, "addr");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "10.0.0.5:29500");
}

TEST_F(KvManagerTest, SetReplacesThePreviousValue) {
  Set("k", "first");
  Set("k", "second");
  EXPECT_EQ(kv_->Get(scope_, "k").value(), "second");
}

TEST_F(KvManagerTest, KeysAreStoredUnderTheRoundPrefix) {
  Set("k", "v");
  EXPECT_EQ(KvRoundPrefix(kJob, 1), "kv/train/1/");
  EXPECT_EQ(storage_.Get("kv/train/1/k").value(), "v");
}

TEST_F(KvManagerTest, GetOfMissingKeyIsNotFoundNamingKeyRoundAndJob) {
  absl::StatusOr<std::string> value = kv_->Get(scope_, "missing");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(value.status().message(),
              HasSubstr("key 'missing' not found in round 1 of job 'train'"));
}

TEST_F(KvManagerTest, DeleteReportsWhetherTheKeyExisted) {
  Set("k", "v");
  absl::StatusOr<bool> first = kv_->Delete(scope_, "k");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  EXPECT_EQ(kv_->Get(scope_, "k").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<bool> second = kv_->Delete(scope_, "k");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(*second);
}

TEST_F(KvManagerTest, ListReturnsPrefixMatchesSortedWithRoundPrefixStripped) {
  Set("rank/2", "c");
  Set("rank/0", "a");
  Set("other", "x");
  Set("rank/10", "d");
  Set("rank/1", "b");
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      kv_->List(scope_, "rank/", /*keys_only=*/false);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, ElementsAre(Pair("rank/0", "a"), Pair("rank/1", "b"),
                                    Pair("rank/10", "d"), Pair("rank/2", "c")));
}

TEST_F(KvManagerTest, ListWithEmptyPrefixReturnsTheWholeRound) {
  Set("b", "2");
  Set("a", "1");
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      kv_->List(scope_, "", /*keys_only=*/false);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, ElementsAre(Pair("a", "1"), Pair("b", "2")));
}

TEST_F(KvManagerTest, ListKeysOnlyLeavesValuesEmpty) {
  Set("p/a", "1");
  Set("p/b", "2");
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      kv_->List(scope_, "p/", /*keys_only=*/true);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, ElementsAre(Pair("p/a", ""), Pair("p/b", "")));
}

TEST_F(KvManagerTest, ListWithTooLongPrefixIsInvalidArgument) {
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      kv_->List(scope_, std::string(1025, 'p'), /*keys_only=*/false);
  EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(entries.status().message(), HasSubstr("prefix is 1025 bytes"));
}

TEST_F(KvManagerTest, JobsDoNotSeeEachOthersKeys) {
  v1::JobConfig config;
  config.set_job_id("train-b");
  ASSERT_TRUE(jobs_.Create(config).ok());
  kv_->OpenRound("train-b", 1);
  const KvScope other{"train-b", 1};
  Set("k", "mine");
  ASSERT_TRUE(kv_->Set(other, "k", "theirs").ok());
  EXPECT_EQ(kv_->Get(scope_, "k").value(), "mine");
  EXPECT_EQ(kv_->Get(other, "k").value(), "theirs");
  EXPECT_THAT(kv_->List(scope_, "", false).value(),
              ElementsAre(Pair("k", "mine")));
  // Moving one job to a new round leaves the other's keys alone.
  kv_->OpenRound("train-b", 2);
  EXPECT_EQ(kv_->Get(scope_, "k").value(), "mine");
}

// ---------------------------------------------------------------------------
// Add

TEST_F(KvManagerTest, AddCreatesTheCounterAtZeroAndReturnsTheNewValue) {
  EXPECT_EQ(kv_->Add(scope_, "n", 5).value(), 5);
  EXPECT_EQ(kv_->Add(scope_, "n", 3).value(), 8);
  EXPECT_EQ(kv_->Add(scope_, "n", -10).value(), -2);
  EXPECT_EQ(kv_->Add(scope_, "n", 0).value(), -2);
  // Stored as decimal text, so Get reads it.
  EXPECT_EQ(kv_->Get(scope_, "n").value(), "-2");
}

TEST_F(KvManagerTest, AddContinuesFromADecimalValueWrittenBySet) {
  Set("n", "41");
  EXPECT_EQ(kv_->Add(scope_, "n", 1).value(), 42);
}

TEST_F(KvManagerTest, AddOnNonNumericValueIsFailedPreconditionAndKeepsIt) {
  Set("n", "not a number");
  absl::StatusOr<int64_t> result = kv_->Add(scope_, "n", 1);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(),
              HasSubstr("key 'n' holds a value that is not a decimal counter"));
  EXPECT_EQ(kv_->Get(scope_, "n").value(), "not a number");
}

TEST_F(KvManagerTest, AddThatOverflowsIsOutOfRangeAndKeepsTheCounter) {
  Set("n", absl::StrCat(INT64_MAX));
  absl::StatusOr<int64_t> result = kv_->Add(scope_, "n", 1);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(result.status().message(), HasSubstr("overflows"));
  EXPECT_EQ(kv_->Get(scope_, "n").value(), absl::StrCat(INT64_MAX));
}

TEST_F(KvManagerTest, ConcurrentAddsSumExactly) {
  constexpr int kThreads = 16;
  constexpr int kAddsPerThread = 250;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        if (!kv_->Add(scope_, "counter", t + 1).ok()) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  // sum over t of (t + 1) * kAddsPerThread
  const int64_t expected =
      int64_t{kThreads} * (kThreads + 1) / 2 * kAddsPerThread;
  EXPECT_EQ(kv_->Get(scope_, "counter").value(), absl::StrCat(expected));
}

// ---------------------------------------------------------------------------
// CompareAndSet

TEST_F(KvManagerTest, CasExpectAbsentSwapsWhenTheKeyIsAbsent) {
  absl::StatusOr<CasResult> cas =
      kv_->CompareAndSet(scope_, "leader", "", /*expect_absent=*/true, "r0");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_TRUE(cas->swapped);
  EXPECT_TRUE(cas->exists);
  EXPECT_EQ(cas->value, "r0");
  EXPECT_EQ(kv_->Get(scope_, "leader").value(), "r0");
}

TEST_F(KvManagerTest, CasExpectAbsentDoesNotSwapWhenTheKeyExists) {
  Set("leader", "r3");
  absl::StatusOr<CasResult> cas =
      kv_->CompareAndSet(scope_, "leader", "", /*expect_absent=*/true, "r0");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_FALSE(cas->swapped);
  EXPECT_TRUE(cas->exists);
  EXPECT_EQ(cas->value, "r3");
  EXPECT_EQ(kv_->Get(scope_, "leader").value(), "r3");
}

TEST_F(KvManagerTest, CasSwapsWhenTheValueEqualsExpected) {
  Set("k", "old");
  absl::StatusOr<CasResult> cas =
      kv_->CompareAndSet(scope_, "k", "old", /*expect_absent=*/false, "new");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_TRUE(cas->swapped);
  EXPECT_TRUE(cas->exists);
  EXPECT_EQ(cas->value, "new");
  EXPECT_EQ(kv_->Get(scope_, "k").value(), "new");
}

TEST_F(KvManagerTest, CasDoesNotSwapOnMismatchAndReturnsTheCurrentValue) {
  Set("k", "current");
  absl::StatusOr<CasResult> cas =
      kv_->CompareAndSet(scope_, "k", "stale", /*expect_absent=*/false, "new");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_FALSE(cas->swapped);
  EXPECT_TRUE(cas->exists);
  EXPECT_EQ(cas->value, "current");
  EXPECT_EQ(kv_->Get(scope_, "k").value(), "current");
}

TEST_F(KvManagerTest, CasWithExpectedValueOnAbsentKeyDoesNotSwap) {
  absl::StatusOr<CasResult> cas =
      kv_->CompareAndSet(scope_, "k", "", /*expect_absent=*/false, "new");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_FALSE(cas->swapped);
  EXPECT_FALSE(cas->exists);
  EXPECT_EQ(cas->value, "");
  EXPECT_EQ(kv_->Get(scope_, "k").status().code(), absl::StatusCode::kNotFound);

  cas = kv_->CompareAndSet(scope_, "k", "x", /*expect_absent=*/false, "new");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_FALSE(cas->swapped);
  EXPECT_FALSE(cas->exists);
}

TEST_F(KvManagerTest, CasWithEmptyExpectedMatchesAnEmptyStoredValue) {
  Set("k", "");
  absl::StatusOr<CasResult> cas =
      kv_->CompareAndSet(scope_, "k", "", /*expect_absent=*/false, "full");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_TRUE(cas->swapped);
  EXPECT_EQ(kv_->Get(scope_, "k").value(), "full");
}

TEST_F(KvManagerTest, CasWithBothExpectedAndExpectAbsentIsInvalidArgument) {
  absl::StatusOr<CasResult> cas =
      kv_->CompareAndSet(scope_, "k", "x", /*expect_absent=*/true, "new");
  EXPECT_EQ(cas.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cas.status().message(), HasSubstr("not both"));
  EXPECT_EQ(kv_->Get(scope_, "k").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(KvManagerTest, ConcurrentCasFromAbsentHasExactlyOneWinner) {
  constexpr int kThreads = 32;
  std::vector<std::optional<absl::StatusOr<CasResult>>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      results[t] =
          kv_->CompareAndSet(scope_, "leader", "",
                             /*expect_absent=*/true, absl::StrCat("rank-", t));
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::string stored = kv_->Get(scope_, "leader").value();
  int winners = 0;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(results[t].has_value());
    ASSERT_TRUE(results[t]->ok()) << results[t]->status();
    const CasResult& cas = **results[t];
    EXPECT_TRUE(cas.exists);
    EXPECT_EQ(cas.value, stored) << "thread " << t;
    if (cas.swapped) {
      ++winners;
      EXPECT_EQ(stored, absl::StrCat("rank-", t));
    }
  }
  EXPECT_EQ(winners, 1);
}

TEST_F(KvManagerTest, ConcurrentCasIncrementsLoseNoUpdates) {
  // Each thread retries value -> value + 1 with CAS until it succeeds.
  constexpr int kThreads = 8;
  constexpr int kIncrements = 100;
  Set("n", "0");
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        std::string seen = kv_->Get(scope_, "n").value();
        while (true) {
          int64_t n = std::stoll(seen);
          absl::StatusOr<CasResult> cas =
              kv_->CompareAndSet(scope_, "n", seen, false, absl::StrCat(n + 1));
          ASSERT_TRUE(cas.ok());
          if (cas->swapped) break;
          seen = cas->value;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(kv_->Get(scope_, "n").value(),
            absl::StrCat(kThreads * kIncrements));
}

// ---------------------------------------------------------------------------
// Limits

TEST_F(KvManagerTest, ValueOfExactlyOneMibIsAccepted) {
  const std::string value(1 << 20, 'v');
  ASSERT_TRUE(kv_->Set(scope_, "big", value).ok());
  EXPECT_EQ(kv_->Get(scope_, "big").value().size(), value.size());
}

TEST_F(KvManagerTest, ValueOverOneMibIsResourceExhaustedAndNotStored) {
  const std::string value((1 << 20) + 1, 'v');
  absl::Status status = kv_->Set(scope_, "big", value);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("1048577 bytes"));
  EXPECT_EQ(kv_->Get(scope_, "big").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(storage_.Scan("kv/", true).value(), IsEmpty());
}

TEST_F(KvManagerTest, OversizedValueDoesNotReplaceAnExistingValue) {
  Set("k", "small");
  EXPECT_EQ(kv_->Set(scope_, "k", std::string((1 << 20) + 1, 'v')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv_->Get(scope_, "k").value(), "small");
}

TEST_F(KvManagerTest, OversizedCasDesiredValueIsResourceExhaustedAndNotStored) {
  absl::StatusOr<CasResult> cas = kv_->CompareAndSet(
      scope_, "k", "", /*expect_absent=*/true, std::string((1 << 20) + 1, 'v'));
  EXPECT_EQ(cas.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv_->Get(scope_, "k").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(KvManagerTest, EmptyKeyIsInvalidArgumentForEveryCall) {
  const std::string empty;
  EXPECT_EQ(kv_->Set(scope_, empty, "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(kv_->Set(scope_, empty, "v").message(),
              HasSubstr("key must be 1-1024 bytes, got 0"));
  EXPECT_EQ(kv_->Get(scope_, empty).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_->Add(scope_, empty, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_->CompareAndSet(scope_, empty, "", true, "v").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_->Delete(scope_, empty).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(storage_.Scan("kv/", true).value(), IsEmpty());
}

TEST_F(KvManagerTest, KeyLongerThan1024BytesIsInvalidArgument) {
  const std::string longest(1024, 'k');
  const std::string too_long(1025, 'k');
  EXPECT_TRUE(kv_->Set(scope_, longest, "v").ok());
  absl::Status status = kv_->Set(scope_, too_long, "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("got 1025"));
  EXPECT_EQ(kv_->Get(scope_, too_long).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_->Add(scope_, too_long, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvManagerTest, KeyCountLimitPerRoundIsResourceExhausted) {
  KvLimits limits;
  limits.max_keys_per_round = 2;
  UseLimits(limits);
  Set("a", "1");
  Set("b", "2");
  absl::Status status = kv_->Set(scope_, "c", "3");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(),
              HasSubstr("holds 2 keys, the limit (--max_kv_keys_per_job)"));
  EXPECT_EQ(kv_->Add(scope_, "c", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Overwriting an existing key needs no new slot.
  Set("a", "11");
  // Deleting frees a slot.
  ASSERT_TRUE(kv_->Delete(scope_, "b").value());
  Set("c", "3");
  // A new round starts with an empty budget.
  kv_->OpenRound(kJob, 2);
  const KvScope round2{kJob, 2};
  EXPECT_TRUE(kv_->Set(round2, "x", "1").ok());
  EXPECT_TRUE(kv_->Set(round2, "y", "1").ok());
}

TEST_F(KvManagerTest, ByteLimitPerRoundCountsKeysAndValues) {
  KvLimits limits;
  limits.max_bytes_per_round = 10;
  UseLimits(limits);
  Set("ab", "cdef");                                    // 6 bytes
  absl::Status status = kv_->Set(scope_, "gh", "ijk");  // would be 11
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(),
              HasSubstr("over 10 bytes, the limit (--max_kv_bytes_per_job)"));
  Set("gh", "ij");  // exactly 10
  // Shrinking a value frees bytes.
  Set("ab", "");    // 6 bytes in all
  Set("kl", "mn");  // 10
}

// ---------------------------------------------------------------------------
// Wait

TEST_F(KvManagerTest, WaitOnPresentKeysCompletesInline) {
  Set("a", "1");
  Set("b", "2");
  WaitOutcome outcome;
  uint64_t ticket =
      kv_->Wait(scope_, {"a", "b"}, absl::Seconds(10), outcome.Callback());
  EXPECT_EQ(ticket, 0u);
  ASSERT_TRUE(outcome.done());
  EXPECT_TRUE(outcome.status().ok()) << outcome.status();
}

TEST_F(KvManagerTest, WaitCompletesWhenTheLastKeyIsSet) {
  WaitOutcome outcome;
  uint64_t ticket =
      kv_->Wait(scope_, {"c", "a", "b"}, absl::Seconds(10), outcome.Callback());
  EXPECT_NE(ticket, 0u);
  EXPECT_FALSE(outcome.done());
  Set("b", "1");
  EXPECT_FALSE(outcome.done());
  Set("a", "1");
  EXPECT_FALSE(outcome.done());
  Set("c", "1");
  ASSERT_TRUE(outcome.done());
  EXPECT_TRUE(outcome.status().ok()) << outcome.status();
  EXPECT_EQ(outcome.calls(), 1);
  // Nothing more happens later.
  clock_.Advance(absl::Hours(2));
  kv_->Poll();
  EXPECT_EQ(outcome.calls(), 1);
}

TEST_F(KvManagerTest, WaitIsWokenByAddAndCompareAndSet) {
  WaitOutcome outcome;
  kv_->Wait(scope_, {"counter", "leader"}, absl::Seconds(10),
            outcome.Callback());
  ASSERT_TRUE(kv_->Add(scope_, "counter", 1).ok());
  EXPECT_FALSE(outcome.done());
  ASSERT_TRUE(kv_->CompareAndSet(scope_, "leader", "", true, "r0").ok());
  ASSERT_TRUE(outcome.done());
  EXPECT_TRUE(outcome.status().ok()) << outcome.status();
}

TEST_F(KvManagerTest, WaitForAKeyThatWasDeletedMeanwhileKeepsWaiting) {
  WaitOutcome outcome;
  kv_->Wait(scope_, {"a", "b"}, absl::Seconds(10), outcome.Callback());
  Set("b", "1");
  ASSERT_TRUE(kv_->Delete(scope_, "b").value());
  Set("a", "1");
  EXPECT_FALSE(outcome.done());
  Set("b", "again");
  ASSERT_TRUE(outcome.done());
  EXPECT_TRUE(outcome.status().ok()) << outcome.status();
}

TEST_F(KvManagerTest, WaitWithDuplicateKeysCompletes) {
  WaitOutcome outcome;
  kv_->Wait(scope_, {"a", "a", "a"}, absl::Seconds(10), outcome.Callback());
  Set("a", "1");
  ASSERT_TRUE(outcome.done());
  EXPECT_TRUE(outcome.status().ok()) << outcome.status();
}

TEST_F(KvManagerTest, ManyWaitsOnTheSameKeyAllComplete) {
  std::vector<WaitOutcome> outcomes(5);
  for (WaitOutcome& outcome : outcomes) {
    kv_->Wait(scope_, {"go"}, absl::Seconds(10), outcome.Callback());
  }
  Set("go", "1");
  for (const WaitOutcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.done());
    EXPECT_TRUE(outcome.status().ok());
  }
}

TEST_F(KvManagerTest, WaitTimesOutOnPollWithDeadlineExceededNamingMissingKeys) {
  Set("present", "1");
  WaitOutcome outcome;
  kv_->Wait(scope_, {"present", "missing-1", "missing-2"}, absl::Seconds(10),
            outcome.Callback());
  clock_.Advance(absl::Seconds(10) - absl::Milliseconds(1));
  kv_->Poll();
  EXPECT_FALSE(outcome.done());
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_FALSE(outcome.done());  // only Poll fails waits
  kv_->Poll();
  ASSERT_TRUE(outcome.done());
  absl::Status status = outcome.status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("round 1 of job 'train'"));
  EXPECT_THAT(status.message(),
              HasSubstr("still missing: 'missing-1', 'missing-2'"));
  EXPECT_THAT(status.message(), Not(HasSubstr("'present'")));
  EXPECT_EQ(outcome.calls(), 1);
  // A key set afterwards does not call back again.
  Set("missing-1", "1");
  Set("missing-2", "1");
  EXPECT_EQ(outcome.calls(), 1);
}

TEST_F(KvManagerTest, WaitWithZeroTimeoutWaitsTheOneHourMaximum) {
  WaitOutcome outcome;
  kv_->Wait(scope_, {"k"}, absl::ZeroDuration(), outcome.Callback());
  clock_.Advance(absl::Minutes(59));
  kv_->Poll();
  EXPECT_FALSE(outcome.done());
  clock_.Advance(absl::Minutes(1));
  kv_->Poll();
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(KvManagerTest, WaitWithTimeoutBeyondTheMaximumIsInvalidArgument) {
  WaitOutcome outcome;
  EXPECT_EQ(kv_->Wait(scope_, {"k"}, absl::Hours(1) + absl::Seconds(1),
                      outcome.Callback()),
            0u);
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outcome.status().message(), HasSubstr("wait timeout"));
}

TEST_F(KvManagerTest, WaitWithNegativeTimeoutIsInvalidArgument) {
  WaitOutcome outcome;
  kv_->Wait(scope_, {"k"}, -absl::Seconds(1), outcome.Callback());
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvManagerTest, WaitWithoutKeysIsInvalidArgument) {
  WaitOutcome outcome;
  EXPECT_EQ(kv_->Wait(scope_, {}, absl::Seconds(1), outcome.Callback()), 0u);
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outcome.status().message(), HasSubstr("at least one key"));
}

TEST_F(KvManagerTest, WaitWithAnInvalidKeyIsInvalidArgument) {
  WaitOutcome outcome;
  kv_->Wait(scope_, {"ok", ""}, absl::Seconds(1), outcome.Callback());
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvManagerTest, WaitIsAbortedWhenTheRoundIsRetired) {
  WaitOutcome outcome;
  kv_->Wait(scope_, {"k"}, absl::Seconds(10), outcome.Callback());
  kv_->RetireRound(kJob, 1);
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(outcome.status().message(), HasSubstr("superseded"));
  // The deadline no longer applies.
  clock_.Advance(absl::Seconds(20));
  kv_->Poll();
  EXPECT_EQ(outcome.calls(), 1);
}

TEST_F(KvManagerTest, WaitIsAbortedWhenANewerRoundOpens) {
  WaitOutcome outcome;
  kv_->Wait(scope_, {"k"}, absl::Seconds(10), outcome.Callback());
  kv_->OpenRound(kJob, 2);
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(outcome.status().message(), HasSubstr("round 2 has closed"));
}

TEST_F(KvManagerTest, RoundChangesOnlyAbortWaitsOfThatJob) {
  v1::JobConfig config;
  config.set_job_id("other");
  ASSERT_TRUE(jobs_.Create(config).ok());
  kv_->OpenRound("other", 1);
  WaitOutcome mine;
  WaitOutcome theirs;
  kv_->Wait(scope_, {"k"}, absl::Seconds(10), mine.Callback());
  kv_->Wait({"other", 1}, {"k"}, absl::Seconds(10), theirs.Callback());
  kv_->RetireRound("other", 1);
  EXPECT_FALSE(mine.done());
  ASSERT_TRUE(theirs.done());
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kAborted);
  Set("k", "1");
  ASSERT_TRUE(mine.done());
  EXPECT_TRUE(mine.status().ok());
}

TEST_F(KvManagerTest, CancelWaitCallsBackWithCancelledOnce) {
  WaitOutcome outcome;
  uint64_t ticket =
      kv_->Wait(scope_, {"k"}, absl::Seconds(10), outcome.Callback());
  ASSERT_NE(ticket, 0u);
  kv_->CancelWait(ticket);
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(outcome.status().message(), HasSubstr("cancelled"));
  // Later events and a second cancel do not call back again.
  kv_->CancelWait(ticket);
  Set("k", "1");
  clock_.Advance(absl::Seconds(20));
  kv_->Poll();
  EXPECT_EQ(outcome.calls(), 1);
}

TEST_F(KvManagerTest, CancelWaitAfterCompletionIsANoOp) {
  WaitOutcome outcome;
  uint64_t ticket =
      kv_->Wait(scope_, {"k"}, absl::Seconds(10), outcome.Callback());
  Set("k", "1");
  ASSERT_TRUE(outcome.done());
  kv_->CancelWait(ticket);
  kv_->CancelWait(0);
  kv_->CancelWait(12345);
  EXPECT_EQ(outcome.calls(), 1);
  EXPECT_TRUE(outcome.status().ok());
}

// ---------------------------------------------------------------------------
// Scopes and rounds

TEST_F(KvManagerTest, UnknownJobIsNotFound) {
  const KvScope scope{"nope", 1};
  EXPECT_EQ(kv_->Set(scope, "k", "v").code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(kv_->Set(scope, "k", "v").message(),
              HasSubstr("job 'nope' not found"));
  EXPECT_EQ(kv_->Get(scope, "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv_->List(scope, "", false).status().code(),
            absl::StatusCode::kNotFound);
  WaitOutcome outcome;
  kv_->Wait(scope, {"k"}, absl::Seconds(1), outcome.Callback());
  ASSERT_TRUE(outcome.done());
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(KvManagerTest, KnownJobWithoutAClosedRoundIsFailedPrecondition) {
  v1::JobConfig config;
  config.set_job_id("fresh");
  ASSERT_TRUE(jobs_.Create(config).ok());
  const KvScope scope{"fresh", 1};
  absl::Status status = kv_->Set(scope, "k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("has no closed round yet"));
  EXPECT_EQ(kv_->Add(scope, "k", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(KvManagerTest, RoundZeroIsInvalidArgument) {
  const KvScope scope{kJob, 0};
  absl::Status status = kv_->Set(scope, "k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("round 0 is not a round"));
  EXPECT_EQ(kv_->Get({kJob, -1}, "k").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvManagerTest, BadJobIdIsInvalidArgument) {
  EXPECT_EQ(kv_->Set({"Bad_Id", 1}, "k", "v").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvManagerTest, OlderRoundIsAbortedAfterANewerRoundOpens) {
  Set("k", "round-1");
  kv_->OpenRound(kJob, 2);
  absl::Status status = kv_->Set(scope_, "k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(status.message(),
              HasSubstr("round 1 of job 'train' is over (latest round: 2"));
  EXPECT_EQ(kv_->Get(scope_, "k").status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(kv_->Delete(scope_, "k").status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(kv_->List(scope_, "", false).status().code(),
            absl::StatusCode::kAborted);
  // Round 2 starts empty; round 1's keys are gone from storage.
  const KvScope round2{kJob, 2};
  EXPECT_EQ(kv_->Get(round2, "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(storage_.Scan("kv/train/1/", true).value(), IsEmpty());
}

TEST_F(KvManagerTest, FutureRoundIsFailedPrecondition) {
  absl::Status status = kv_->Set({kJob, 2}, "k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("round 2 of job 'train' has not closed"));
}

TEST_F(KvManagerTest, RetiredRoundIsAbortedAndItsKeysAreDropped) {
  Set("k", "v");
  kv_->RetireRound(kJob, 1);
  absl::Status status = kv_->Set(scope_, "k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(status.message(), HasSubstr("superseded"));
  // The next round has not closed yet.
  EXPECT_EQ(kv_->Set({kJob, 2}, "k", "v").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(storage_.Scan("kv/train/", true).value(), IsEmpty());
  // Once it opens it works.
  kv_->OpenRound(kJob, 2);
  EXPECT_TRUE(kv_->Set({kJob, 2}, "k", "v").ok());
  EXPECT_EQ(kv_->Set(scope_, "k", "v").code(), absl::StatusCode::kAborted);
}

TEST_F(KvManagerTest, RetiringAnOlderRoundIsIgnored) {
  kv_->OpenRound(kJob, 2);
  const KvScope round2{kJob, 2};
  ASSERT_TRUE(kv_->Set(round2, "k", "v").ok());
  kv_->RetireRound(kJob, 1);
  EXPECT_EQ(kv_->Get(round2, "k").value(), "v");
}


// ---------------------------------------------------------------------------
// RestoreRound: a new manager over the same storage, as after a restart



class KvRestoreTest : public KvManagerTest {
 protected:
  // A manager as a restarted coordinator builds it: same storage, no state.
  std::unique_ptr<KvManager> Restarted(KvLimits limits = KvLimits()) {
    return std::make_unique<KvManager>(&storage_, &clock_, &jobs_, limits);
  }
};

TEST_F(KvRestoreTest, AnOpenRoundKeepsItsKeysAndServesCallsAgain) {
  Set("addr", "10.0.0.5:29500");
  std::unique_ptr<KvManager> kv = Restarted();
  ASSERT_TRUE(kv->RestoreRound(kJob, 1, /*open=*/true).ok());
  EXPECT_EQ(kv->Get(scope_, "addr").value(), "10.0.0.5:29500");
  EXPECT_TRUE(kv->Set(scope_, "new", "v").ok());
}

TEST_F(KvRestoreTest, RestoredKeysCountAgainstTheRoundsLimits) {
  Set("a", "1");
  Set("b", "2");
  KvLimits limits;
  limits.max_keys_per_round = 3;
  std::unique_ptr<KvManager> kv = Restarted(limits);
  ASSERT_TRUE(kv->RestoreRound(kJob, 1, /*open=*/true).ok());
  EXPECT_TRUE(kv->Set(scope_, "c", "3").ok());
  EXPECT_EQ(kv->Set(scope_, "d", "4").code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(KvRestoreTest, ARetiredRoundRefusesCallsAndDropsItsKeys) {
  Set("addr", "x");
  std::unique_ptr<KvManager> kv = Restarted();
  ASSERT_TRUE(kv->RestoreRound(kJob, 1, /*open=*/false).ok());
  absl::StatusOr<std::string> value = kv->Get(scope_, "addr");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(storage_.Scan("kv/", /*keys_only=*/true).value(), IsEmpty());
}

TEST_F(KvRestoreTest, AnAddRetriedAfterARestartIsAnsweredAsTheFirst) {
  // The coordinator stored the Add, then stopped before its answer left.
  ASSERT_EQ(kv_->Add(scope_, "barrier", 1, "r1").value(), 1);
  ASSERT_EQ(kv_->Add(scope_, "barrier", 1, "r2").value(), 2);
  kv_.reset();
  std::unique_ptr<KvManager> kv = Restarted();
  ASSERT_TRUE(kv->RestoreRound(kJob, 1, /*open=*/true).ok());
  EXPECT_EQ(kv->Add(scope_, "barrier", 1, "r1").value(), 1);
  EXPECT_EQ(kv->Get(scope_, "barrier").value(), "2");
  EXPECT_EQ(kv->Add(scope_, "barrier", 1, "r3").value(), 3);
  CasResult cas = kv->CompareAndSet(scope_, "k", "", true, "v", "c1").value();
  ASSERT_TRUE(cas.swapped);
  kv.reset();
  kv = Restarted();
  ASSERT_TRUE(kv->RestoreRound(kJob, 1, /*open=*/true).ok());
  EXPECT_TRUE(kv->CompareAndSet(scope_, "k", "", true, "v", "c1").value().swapped);
}

TEST_F(KvRestoreTest, RequestRecordsOfOtherRoundsAndUnreadableOnesAreDropped) {
  ASSERT_TRUE(kv_->Add(scope_, "n", 1, "r1").ok());
  ASSERT_TRUE(storage_.Put("kvreq/train/0/old", "add 1 n").ok());
  ASSERT_TRUE(storage_.Put("kvreq/train/1/bad", "neither").ok());
  std::unique_ptr<KvManager> kv = Restarted();
  ASSERT_TRUE(kv->RestoreRound(kJob, 1, /*open=*/true).ok());
  EXPECT_THAT(storage_.Scan("kvreq/", /*keys_only=*/true).value(),
              ElementsAre(Pair("kvreq/train/1/r1", "")));
  ASSERT_TRUE(kv->RestoreRound(kJob, 1, /*open=*/false).ok());
  EXPECT_THAT(storage_.Scan("kvreq/", /*keys_only=*/true).value(), IsEmpty());
}

// A coordinator before ForgetJob deleted a job's request records left them
// when it forgot the job: the next start deletes what no job owns.
TEST_F(KvRestoreTest, KeysAndRecordsOfForgottenJobsAreDeletedAtStart) {
  Set("addr", "x");
  ASSERT_TRUE(kv_->Add(scope_, "n", 1, "r1").ok());
  ASSERT_TRUE(storage_.Put("kvreq/gone/3/r7", "add 1 n").ok());
  ASSERT_TRUE(storage_.Put("kv/gone/3/addr", "y").ok());
  ASSERT_TRUE(storage_.Put("kvreq/also-gone/1/r1", "add 1 n").ok());
  std::unique_ptr<KvManager> kv = Restarted();
  absl::StatusOr<int> dropped = kv->DropForgottenJobs(
      [this](const std::string& job_id) { return jobs_.Exists(job_id); });
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 2);
  EXPECT_THAT(storage_.Scan("kv/", /*keys_only=*/true).value(),
              ElementsAre(Pair("kv/train/1/addr", ""), Pair("kv/train/1/n", "")));
  EXPECT_THAT(storage_.Scan("kvreq/", /*keys_only=*/true).value(),
              ElementsAre(Pair("kvreq/train/1/r1", "")));
  EXPECT_EQ(kv->DropForgottenJobs([](const std::string&) { return true; }).value(),
            0);
}

TEST_F(KvRestoreTest, KeysOfOlderRoundsAreDropped) {
  Set("old", "x");
  ASSERT_TRUE(storage_.Put("kv/train/0/stale", "y").ok());
  std::unique_ptr<KvManager> kv = Restarted();
  ASSERT_TRUE(kv->RestoreRound(kJob, 1, /*open=*/true).ok());
  EXPECT_THAT(storage_.Scan("kv/", /*keys_only=*/true).value(),
              ElementsAre(Pair("kv/train/1/old", "")));
}



}  // namespace
}  // namespace gradsync
