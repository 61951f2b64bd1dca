// GroupCommit on a storage whose commits the test holds open: writes queued
// while a commit runs share the next one; a failure that may pass is
// committed again; a failed commit fails its jobs' writes and theirs queued
// behind it, and tells the owner under its lock, and one job's refused
// write fails no other job's; the destructor commits what is still queued.
#include "server/group_commit.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/controlled_storage.h"

namespace gradsync {
namespace {

using ::gradsync::testing::ControlledStorage;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Storage::Mutation Put(const std::string& key) {
  return {Storage::Mutation::Kind::kPut, key, "v"};
}

// The outcomes of the writes, by index.
struct Outcomes {
  absl::Mutex mu;
  std::vector<absl::Status> statuses ABSL_GUARDED_BY(mu);
  GroupCommit::WriteCallback At(size_t i) {
    {
      absl::MutexLock lock(&mu);
      if (statuses.size() <= i) {
        statuses.resize(i + 1, absl::UnknownError("not run"));
      }
    }
    return [this, i](absl::Status status) {
      absl::MutexLock lock(&mu);
      statuses[i] = std::move(status);
    };
  }
};

TEST(GroupCommitTest, WritesQueuedDuringACommitShareTheNext) {
  ControlledStorage storage(/*open=*/false);
  absl::Mutex owner;
  Outcomes outcomes;
  {
    GroupCommit commit(&storage, &owner, [](const std::set<std::string>&) {
      ADD_FAILURE() << "nothing fails";
    });
    uint64_t first;
    {
      absl::MutexLock lock(&owner);
      first = commit.Queue("a", Put("k0"), outcomes.At(0));
    }
    storage.AwaitEntered(1);  // the first commit holds the write alone
    uint64_t last = 0;
    for (int i = 1; i <= 10; ++i) {
      absl::MutexLock lock(&owner);
      last = commit.Queue("a", Put(absl::StrCat("k", i)), outcomes.At(i));
    }
    EXPECT_EQ(last, first + 10);
    EXPECT_EQ(commit.QueuedWrites(), 10);
    storage.Open();
    EXPECT_TRUE(commit.AwaitDurable(last).ok());
    EXPECT_GE(commit.SettledSeq(), last);
    EXPECT_EQ(commit.QueuedWrites(), 0);
  }
  EXPECT_THAT(storage.batches(), ElementsAre(1, 10));
  absl::MutexLock lock(&outcomes.mu);
  for (const absl::Status& status : outcomes.statuses) {
    EXPECT_TRUE(status.ok()) << status;
  }
  EXPECT_TRUE(storage.Get("k10").ok());
}

// WhenDurable: at once for a settled write, on the commit for one queued,
// with the write's outcome.
TEST(GroupCommitTest, WhenDurableAnswersOnceTheWriteSettles) {
  ControlledStorage storage(/*open=*/false);
  absl::Mutex owner;
  Outcomes outcomes;
  GroupCommit commit(&storage, &owner, [](const std::set<std::string>&) {});
  commit.WhenDurable(0, outcomes.At(0));  // nothing to wait for
  {
    absl::MutexLock lock(&outcomes.mu);
    EXPECT_TRUE(outcomes.statuses[0].ok()) << outcomes.statuses[0];
  }
  uint64_t held;
  {
    absl::MutexLock lock(&owner);
    held = commit.Queue("a", Put("k"));
  }
  storage.AwaitEntered(1);
  commit.WhenDurable(held, outcomes.At(1));
  {
    absl::MutexLock lock(&outcomes.mu);
    EXPECT_EQ(outcomes.statuses[1].code(), absl::StatusCode::kUnknown)
        << "answered before the commit";
  }
  storage.Open();
  ASSERT_TRUE(commit.AwaitDurable(held).ok());
  commit.WhenDurable(held, outcomes.At(2));  // settled by now
  storage.FailNext();
  uint64_t failing;
  {
    absl::MutexLock lock(&owner);
    failing = commit.Queue("a", Put("k2"));
  }
  commit.WhenDurable(failing, outcomes.At(3));
  EXPECT_FALSE(commit.AwaitDurable(failing).ok());
  absl::MutexLock lock(&outcomes.mu);
  // (Its callback runs just after AwaitDurable's waiters wake.)
  const auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(outcomes.mu) {
    return outcomes.statuses[3].code() != absl::StatusCode::kUnknown;
  };
  outcomes.mu.Await(absl::Condition(&answered));
  EXPECT_TRUE(outcomes.statuses[1].ok()) << outcomes.statuses[1];
  EXPECT_TRUE(outcomes.statuses[2].ok()) << outcomes.statuses[2];
  EXPECT_EQ(outcomes.statuses[3].code(), absl::StatusCode::kUnavailable)
      << outcomes.statuses[3];
  EXPECT_THAT(outcomes.statuses[3].message(), HasSubstr("disk full"));
}

TEST(GroupCommitTest, AFailedCommitFailsItsJobsWritesAndThoseQueuedBehindThem) {
  ControlledStorage storage(/*open=*/false);
  absl::Mutex owner;
  Outcomes outcomes;
  std::set<std::string> told;  // guarded by `owner`
  GroupCommit commit(
      &storage, &owner,
      [&](const std::set<std::string>& job_ids) {
        owner.AssertHeld();  // writers are kept out
        told.insert(job_ids.begin(), job_ids.end());
      },
      /*retry_for=*/absl::Milliseconds(200));
  uint64_t a, b;
  {
    absl::MutexLock lock(&owner);
    a = commit.Queue("job-a", Put("a"), outcomes.At(0));
  }
  storage.AwaitEntered(1);
  {
    absl::MutexLock lock(&owner);
    b = commit.Queue("job-a", Put("b"), outcomes.At(1));
  }
  storage.SetFailing(true);
  storage.Open();
  const absl::Status failed = commit.AwaitDurable(b);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.message(),
              HasSubstr("could not store the write: disk gone"));
  EXPECT_EQ(commit.AwaitDurable(a).code(), absl::StatusCode::kUnavailable);
  {
    // Told before the owner's lock is released (callers may learn of the
    // failure just before).
    absl::MutexLock lock(&owner);
    EXPECT_THAT(told, ElementsAre("job-a"));
  }
  // Later writes commit again.
  storage.SetFailing(false);
  uint64_t c;
  {
    absl::MutexLock lock(&owner);
    c = commit.Queue("job-a", Put("c"), outcomes.At(2));
  }
  EXPECT_TRUE(commit.AwaitDurable(c).ok());
  EXPECT_TRUE(storage.Get("c").ok());
  EXPECT_EQ(storage.Get("b").status().code(), absl::StatusCode::kNotFound);
}

// An etcd election, say: the batch is committed again and every write is
// acknowledged; nobody is told of a failure.
TEST(GroupCommitTest, AFailureThatMayPassIsCommittedAgain) {
  ControlledStorage storage(/*open=*/true);
  absl::Mutex owner;
  GroupCommit commit(&storage, &owner, [](const std::set<std::string>&) {
    ADD_FAILURE() << "nothing fails";
  });
  storage.FailNext(absl::UnavailableError("etcd: leader changed"));
  uint64_t seq;
  {
    absl::MutexLock lock(&owner);
    seq = commit.Queue("a", Put("k"));
  }
  EXPECT_TRUE(commit.AwaitDurable(seq).ok());
  EXPECT_TRUE(storage.Get("k").ok());
  EXPECT_THAT(storage.batches(), ElementsAre(1, 1)) << "tried twice";
}

TEST(GroupCommitTest, OneJobsRefusedWriteFailsOnlyThatJobsWrites) {
  ControlledStorage storage(/*open=*/false);
  absl::Mutex owner;
  std::set<std::string> told;  // guarded by `owner`
  GroupCommit commit(&storage, &owner,
                     [&](const std::set<std::string>& job_ids) {
                       told.insert(job_ids.begin(), job_ids.end());
                     });
  storage.RefusePutsUnder("big/");
  std::vector<uint64_t> seqs;
  {
    absl::MutexLock lock(&owner);
    seqs.push_back(commit.Queue("hold", Put("held")));
  }
  storage.AwaitEntered(1);
  {
    // One batch: job a's writes around job b's refused one, and a write of
    // b queued after it.
    absl::MutexLock lock(&owner);
    seqs.push_back(commit.Queue("a", Put("a1")));
    seqs.push_back(commit.Queue("b", Put("big/b1")));
    seqs.push_back(commit.Queue("a", Put("a2")));
    seqs.push_back(commit.Queue("b", Put("b2")));
  }
  storage.Open();
  for (int i : {0, 1, 3}) {
    const absl::Status status = commit.AwaitDurable(seqs[i]);
    EXPECT_TRUE(status.ok()) << i << ": " << status;
  }
  for (int i : {2, 4}) {
    const absl::Status status = commit.AwaitDurable(seqs[i]);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << i;
    EXPECT_THAT(status.message(), HasSubstr("refused 'big/b1'")) << i;
  }
  {
    absl::MutexLock lock(&owner);
    EXPECT_THAT(told, ElementsAre("b"));
  }
  EXPECT_TRUE(storage.Get("a1").ok());
  EXPECT_TRUE(storage.Get("a2").ok());
  EXPECT_EQ(storage.Get("b2").status().code(), absl::StatusCode::kNotFound);
}

TEST(GroupCommitTest, TheDestructorCommitsWhatIsStillQueued) {
  ControlledStorage storage(/*open=*/false);
  absl::Mutex owner;
  Outcomes outcomes;
  {
    GroupCommit commit(&storage, &owner, [](const std::set<std::string>&) {});
    {
      absl::MutexLock lock(&owner);
      commit.Queue("a", Put("x"), outcomes.At(0));
    }
    storage.AwaitEntered(1);
    {
      absl::MutexLock lock(&owner);
      commit.Queue("a", Put("y"), outcomes.At(1));
    }
    storage.Open();
  }  // destroyed with "y" possibly still queued
  EXPECT_TRUE(storage.Get("y").ok());
  absl::MutexLock lock(&outcomes.mu);
  EXPECT_TRUE(outcomes.statuses[1].ok()) << outcomes.statuses[1];
}

}  // namespace
}  // namespace gradsync
