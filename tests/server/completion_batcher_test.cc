// CompletionBatcher over a HealthManager and a JobManager whose storage
// the test holds: the completions that arrive while one is committing are
// recorded together in the next write, every one is answered, and the
// destructor answers what is still queued.
#include "server/completion_batcher.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/health_manager.h"
#include "server/job_manager.h"
#include "tests/testing/controlled_storage.h"

namespace gradsync {
namespace {

constexpr int kMembers = 50;

class CompletionBatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::JobConfig config;
    config.set_job_id("train");
    config.set_min_nodes(kMembers);
    ASSERT_TRUE(jobs_.Create(config).ok());
    std::vector<v1::Member> members(kMembers);
    for (int r = 0; r < kMembers; ++r) {
      members[r].set_rank(r);
      members[r].mutable_node()->set_incarnation_id(absl::StrCat("inc-", r));
      members[r].set_state(v1::MEMBER_STATE_ACTIVE);
    }
    ASSERT_TRUE(
        jobs_.RecordRoundClosed("train", 1, v1::BACKEND_GLOO, members).ok());
  }

  static v1::ReportCompletionRequest Success(int rank) {
    v1::ReportCompletionRequest request;
    request.mutable_member()->set_job_id("train");
    request.mutable_member()->set_round(1);
    request.mutable_member()->set_rank(rank);
    request.mutable_member()->set_incarnation_id(absl::StrCat("inc-", rank));
    request.set_success(true);
    return request;
  }

  // Queues rank `rank`'s success; its answer goes to answers_[rank].
  void Report(CompletionBatcher* batcher, int rank) {
    batcher->Report(Success(rank), [this, rank](absl::StatusOr<v1::JobState> s) {
      absl::MutexLock lock(&mu_);
      answers_[rank] = s;
      ++answered_;
    });
  }

  void AwaitAnswered(int n) {
    absl::MutexLock lock(&mu_);
    const auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return answered_ >= n;
    };
    mu_.Await(absl::Condition(&done));
  }

  // Writes of member changes that reached storage.
  int ChangeWrites() const {
    return static_cast<int>(
        storage_.Scan("jobs/train/changes/", true)->size());
  }

  testing::ControlledStorage storage_;
  FakeClock clock_;
  JobManager jobs_{&storage_, &clock_};
  HealthManager health_{&jobs_, &clock_, HealthConfig()};
  absl::Mutex mu_;
  std::vector<absl::StatusOr<v1::JobState>> answers_ ABSL_GUARDED_BY(mu_) =
      std::vector<absl::StatusOr<v1::JobState>>(
          kMembers, absl::UnknownError("no answer"));
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(CompletionBatcherTest, CompletionsQueuedDuringACommitGoInTheNextOne) {
  CompletionBatcher batcher(&health_);
  storage_.HoldPutsUnder("jobs/train/changes/");
  Report(&batcher, 0);
  storage_.AwaitHeld(1);  // rank 0's write is committing
  for (int r = 1; r < kMembers; ++r) Report(&batcher, r);
  storage_.Release();
  AwaitAnswered(kMembers);
  EXPECT_EQ(ChangeWrites(), 2) << "rank 0's, then the other 49 together";
  absl::MutexLock lock(&mu_);
  ASSERT_TRUE(answers_[0].ok()) << answers_[0].status();
  EXPECT_EQ(*answers_[0], v1::JOB_STATE_RUNNING);
  for (int r = 1; r < kMembers; ++r) {
    ASSERT_TRUE(answers_[r].ok()) << answers_[r].status();
    EXPECT_EQ(*answers_[r], v1::JOB_STATE_SUCCEEDED) << r;
  }
  EXPECT_EQ(jobs_.Get("train")->state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CompletionBatcherTest, TheDestructorAnswersWhatIsQueued) {
  {
    CompletionBatcher batcher(&health_);
    for (int r = 0; r < kMembers; ++r) Report(&batcher, r);
  }
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(answered_, kMembers);
  EXPECT_EQ(jobs_.Get("train")->state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace gradsync
