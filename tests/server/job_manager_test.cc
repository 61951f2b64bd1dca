#include "server/job_manager.h"

#include <google/protobuf/util/message_differencer.h>

#include <map>
#include <thread>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"
#include "server/storage/in_memory_storage.h"
#include "tests/testing/controlled_storage.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

v1::JobConfig Config(const std::string& id, int min_nodes = 0,
                     int max_nodes = 0) {
  v1::JobConfig config;
  config.set_job_id(id);
  config.set_min_nodes(min_nodes);
  config.set_max_nodes(max_nodes);
  return config;
}

v1::Member MemberWithRank(int rank, const std::string& node_id) {
  v1::Member member;
  member.set_rank(rank);
  member.set_local_rank(0);
  member.set_node_rank(rank);
  member.mutable_node()->set_node_id(node_id);
  member.mutable_node()->set_incarnation_id("inc-" + node_id);
  member.set_state(v1::MEMBER_STATE_ACTIVE);
  return member;
}

class JobManagerTest : public ::testing::Test {
 protected:
  InMemoryStorage storage_;
  FakeClock clock_;
  JobManager jobs_{&storage_, &clock_};
};

// ---------------------------------------------------------------------------
// Create

TEST_F(JobManagerTest, CreateMakesAWaitingJobWithANormalizedConfig) {
  absl::StatusOr<v1::JobStatus> job = jobs_.Create(Config("train", 2, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->config().job_id(), "train");
  EXPECT_EQ(job->config().min_nodes(), 2);
  EXPECT_EQ(job->config().max_nodes(), 4);
  EXPECT_EQ(job->config().nproc_per_node(), 1);
  EXPECT_EQ(job->config().backend(), v1::BACKEND_AUTO);
  EXPECT_EQ(FromProtoDuration(job->config().last_call_timeout()),
            kDefaultLastCallTimeout);
  EXPECT_EQ(job->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(job->round(), 0);
  EXPECT_THAT(job->members(), IsEmpty());
  EXPECT_EQ(FromProtoTime(job->create_time()), clock_.Now());
  EXPECT_EQ(FromProtoTime(job->update_time()), clock_.Now());
  EXPECT_TRUE(jobs_.Exists("train"));
}

TEST_F(JobManagerTest, CreateOfAnExistingIdIsAlreadyExistsEvenWithSameConfig) {
  ASSERT_TRUE(jobs_.Create(Config("train")).ok());
  absl::StatusOr<v1::JobStatus> again = jobs_.Create(Config("train"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("'train' already exists"));
  absl::StatusOr<v1::JobStatus> other = jobs_.Create(Config("train", 3));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(JobManagerTest, CreateWithBadConfigIsInvalidArgumentAndCreatesNothing) {
  absl::StatusOr<v1::JobStatus> bad_id = jobs_.Create(Config("Bad_Id"));
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::JobStatus> bad_range = jobs_.Create(Config("j", 3, 2));
  EXPECT_EQ(bad_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_range.status().message(), HasSubstr("nodes 3:2"));
  EXPECT_FALSE(jobs_.Exists("j"));
  EXPECT_THAT(jobs_.List(), IsEmpty());
  EXPECT_THAT(storage_.Scan("", true).value(), IsEmpty());
}

// ---------------------------------------------------------------------------
// Get / Exists

TEST(JobManagerLimitsTest, PastALimitCreateIsResourceExhaustedNamingItsFlag) {
  InMemoryStorage storage;
  FakeClock clock;
  JobLimits limits;
  limits.max_jobs = 2;
  limits.max_world_size = 8;
  JobManager jobs(&storage, &clock, limits);
  v1::JobConfig big = Config("big", 2, 3);
  big.set_nproc_per_node(3);  // up to 9 processes
  absl::StatusOr<v1::JobStatus> refused = jobs.Create(big);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("may have 9 processes (3 nodes x 3), over the limit "
                        "of 8 (--max_world_size)"));
  ASSERT_TRUE(jobs.Create(Config("a", 1, 1)).ok());
  ASSERT_TRUE(jobs.Create(Config("b", 1, 1)).ok());
  refused = jobs.Create(Config("c", 1, 1));
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("holds 2 jobs, its limit (--max_jobs=2)"));
  EXPECT_EQ(jobs.List().size(), 2u) << "a refused job changes nothing";
}

TEST(JobManagerLimitsTest, WithoutCreateOnJoinOnlyCreateMakesJobs) {
  InMemoryStorage storage;
  FakeClock clock;
  JobLimits limits;
  limits.create_on_join = false;
  JobManager jobs(&storage, &clock, limits);
  const v1::JobConfig config = Config("train", 1, 1);
  absl::StatusOr<v1::JobConfig> joined = jobs.GetOrCreate("train", &config);
  EXPECT_TRUE(absl::IsFailedPrecondition(joined.status())) << joined.status();
  EXPECT_THAT(std::string(joined.status().message()),
              HasSubstr("--create_jobs_on_join=false"));
  EXPECT_TRUE(jobs.List().empty());
  ASSERT_TRUE(jobs.Create(config).ok());
  EXPECT_TRUE(jobs.GetOrCreate("train", &config).ok());
}

TEST_F(JobManagerTest, GetOfUnknownJobIsNotFound) {
  absl::StatusOr<v1::JobStatus> job = jobs_.Get("nope");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(job.status().message(), HasSubstr("'nope'"));
  EXPECT_FALSE(jobs_.Exists("nope"));
}

TEST_F(JobManagerTest, GetReturnsTheCreatedRecord) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2)).ok());
  absl::StatusOr<v1::JobStatus> job = jobs_.Get("train");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->config().min_nodes(), 2);
  EXPECT_EQ(job->state(), v1::JOB_STATE_WAITING);
}

// ---------------------------------------------------------------------------
// GetOrCreate

TEST_F(JobManagerTest, GetOrCreateWithoutConfigForUnknownJobIsNotFound) {
  absl::StatusOr<v1::JobConfig> config = jobs_.GetOrCreate("train", nullptr);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr("'train' does not exist"));
  EXPECT_FALSE(jobs_.Exists("train"));
}

TEST_F(JobManagerTest, GetOrCreateWithConfigCreatesTheJob) {
  v1::JobConfig in = Config("train", 2, 3);
  absl::StatusOr<v1::JobConfig> config = jobs_.GetOrCreate("train", &in);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->min_nodes(), 2);
  EXPECT_EQ(config->max_nodes(), 3);
  EXPECT_EQ(config->nproc_per_node(), 1);  // normalized
  ASSERT_TRUE(jobs_.Exists("train"));
  EXPECT_EQ(jobs_.Get("train")->state(), v1::JOB_STATE_WAITING);
}

TEST_F(JobManagerTest, GetOrCreateFillsAMissingJobIdFromTheRequest) {
  v1::JobConfig in = Config("", 2);
  absl::StatusOr<v1::JobConfig> config = jobs_.GetOrCreate("train", &in);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job_id(), "train");
  EXPECT_TRUE(jobs_.Exists("train"));
}

TEST_F(JobManagerTest, GetOrCreateWithAConfigNamingAnotherJobIsInvalid) {
  v1::JobConfig in = Config("other");
  absl::StatusOr<v1::JobConfig> config = jobs_.GetOrCreate("train", &in);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("'other'"));
  EXPECT_FALSE(jobs_.Exists("train"));
  EXPECT_FALSE(jobs_.Exists("other"));
}

TEST_F(JobManagerTest, GetOrCreateWithBadIdIsInvalidArgument) {
  absl::StatusOr<v1::JobConfig> config = jobs_.GetOrCreate("BAD", nullptr);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  v1::JobConfig in = Config("BAD");
  config = jobs_.GetOrCreate("BAD", &in);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(jobs_.List(), IsEmpty());
}

TEST_F(JobManagerTest, GetOrCreateOfExistingJobWithoutConfigReturnsItsConfig) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2, 5)).ok());
  absl::StatusOr<v1::JobConfig> config = jobs_.GetOrCreate("train", nullptr);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->min_nodes(), 2);
  EXPECT_EQ(config->max_nodes(), 5);
}

TEST_F(JobManagerTest, GetOrCreateOfExistingJobAcceptsAnEquivalentConfig) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2, 2)).ok());
  // Equivalent once normalized (max defaults to min).
  v1::JobConfig in = Config("train", 2, 0);
  absl::StatusOr<v1::JobConfig> config = jobs_.GetOrCreate("train", &in);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->max_nodes(), 2);
  EXPECT_EQ(jobs_.List().size(), 1u);
}

TEST_F(JobManagerTest, GetOrCreateOfExistingJobWithDifferentConfigFails) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2, 2)).ok());
  v1::JobConfig in = Config("train", 3, 3);
  absl::StatusOr<v1::JobConfig> config = jobs_.GetOrCreate("train", &in);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(config.status().message(),
              HasSubstr("exists with a different config (nodes 2:2"));
  EXPECT_THAT(config.status().message(), HasSubstr("asked for nodes 3:3"));
  // The job keeps its original config.
  EXPECT_EQ(jobs_.Get("train")->config().min_nodes(), 2);
}

// ---------------------------------------------------------------------------
// List

TEST_F(JobManagerTest, ListIsOrderedByIdAndOmitsMembers) {
  for (const char* id : {"charlie", "alpha", "bravo"}) {
    ASSERT_TRUE(jobs_.Create(Config(id)).ok());
  }
  ASSERT_TRUE(jobs_
                  .RecordRoundClosed("bravo", 1, v1::BACKEND_GLOO,
                                     {MemberWithRank(0, "n0")})
                  .ok());
  std::vector<v1::JobStatus> list = jobs_.List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].config().job_id(), "alpha");
  EXPECT_EQ(list[1].config().job_id(), "bravo");
  EXPECT_EQ(list[2].config().job_id(), "charlie");
  EXPECT_EQ(list[1].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(list[1].world_size(), 1);
  for (const v1::JobStatus& job : list) EXPECT_THAT(job.members(), IsEmpty());
  // Get still has the members.
  EXPECT_EQ(jobs_.Get("bravo")->members_size(), 1);
}

TEST_F(JobManagerTest, ListOfNoJobsIsEmpty) {
  EXPECT_THAT(jobs_.List(), IsEmpty());
}

// ---------------------------------------------------------------------------
// Round transitions

TEST_F(JobManagerTest, RecordRoundClosedSetsRunningRoundWorldSizeAndMembers) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2)).ok());
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(
      jobs_
          .RecordRoundClosed("train", 1, v1::BACKEND_NCCL,
                             {MemberWithRank(0, "a"), MemberWithRank(1, "b")})
          .ok());
  absl::StatusOr<v1::JobStatus> job = jobs_.Get("train");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->round(), 1);
  EXPECT_EQ(job->world_size(), 2);
  EXPECT_EQ(job->backend(), v1::BACKEND_NCCL);
  ASSERT_EQ(job->members_size(), 2);
  EXPECT_EQ(job->members(0).rank(), 0);
  EXPECT_EQ(job->members(0).node().node_id(), "a");
  EXPECT_EQ(job->members(1).rank(), 1);
  EXPECT_EQ(job->members(1).node().node_id(), "b");
  EXPECT_EQ(FromProtoTime(job->round_close_time()), clock_.Now());
  EXPECT_EQ(FromProtoTime(job->update_time()), clock_.Now());
  EXPECT_LT(FromProtoTime(job->create_time()), clock_.Now());
}

TEST_F(JobManagerTest, RecordRoundSupersededGoesBackToWaitingWithReason) {
  ASSERT_TRUE(jobs_.Create(Config("train")).ok());
  ASSERT_TRUE(jobs_
                  .RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                                     {MemberWithRank(0, "a")})
                  .ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(
      jobs_.RecordRoundSuperseded("train", "rank 0 rejoined after round 1")
          .ok());
  absl::StatusOr<v1::JobStatus> job = jobs_.Get("train");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(job->reason(), "rank 0 rejoined after round 1");
  EXPECT_EQ(job->round(), 1);         // still the latest closed round
  EXPECT_EQ(job->members_size(), 1);  // shown as they were
  EXPECT_EQ(FromProtoTime(job->update_time()), clock_.Now());
}

TEST_F(JobManagerTest, RecordRoundClosedClearsTheSupersededReason) {
  ASSERT_TRUE(jobs_.Create(Config("train")).ok());
  ASSERT_TRUE(jobs_
                  .RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                                     {MemberWithRank(0, "a")})
                  .ok());
  ASSERT_TRUE(jobs_.RecordRoundSuperseded("train", "why").ok());
  ASSERT_TRUE(jobs_
                  .RecordRoundClosed("train", 2, v1::BACKEND_GLOO,
                                     {MemberWithRank(0, "b")})
                  .ok());
  absl::StatusOr<v1::JobStatus> job = jobs_.Get("train");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->round(), 2);
  EXPECT_EQ(job->reason(), "");
  ASSERT_EQ(job->members_size(), 1);
  EXPECT_EQ(job->members(0).node().node_id(), "b");
}

TEST_F(JobManagerTest, RoundTransitionsOfUnknownJobAreNotFound) {
  EXPECT_EQ(jobs_.RecordRoundClosed("nope", 1, v1::BACKEND_GLOO, {}).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_.RecordRoundSuperseded("nope", "why").code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(jobs_.Exists("nope"));
}

// ---------------------------------------------------------------------------
// Persistence

TEST_F(JobManagerTest, RecordsAreWrittenThroughToStorageUnderJobsPrefix) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2)).ok());
  absl::StatusOr<std::string> stored = storage_.Get("jobs/train");
  ASSERT_TRUE(stored.ok()) << stored.status();
  v1::JobStatus record;
  ASSERT_TRUE(record.ParseFromString(*stored));
  EXPECT_EQ(record.config().min_nodes(), 2);
  EXPECT_EQ(record.state(), v1::JOB_STATE_WAITING);

  ASSERT_TRUE(
      jobs_
          .RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                             {MemberWithRank(0, "a"), MemberWithRank(1, "b")})
          .ok());
  ASSERT_TRUE(record.ParseFromString(storage_.Get("jobs/train").value()));
  EXPECT_EQ(record.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(record.world_size(), 2);
  EXPECT_EQ(record.members_size(), 0);  // kept beside the record, in parts
  v1::StoredMembers chunk;
  ASSERT_TRUE(chunk.ParseFromString(
      storage_.Get("jobs/train/members/00000000000000000001/00000000000000000000")
          .value()));
  EXPECT_EQ(chunk.members_size(), 2);
}

// The bytes of the entries under "jobs/" that `after` has and `before` did
// not (new keys and changed values, keys counted too).
int64_t BytesWritten(const std::vector<Storage::Entry>& before,
                     const std::vector<Storage::Entry>& after) {
  std::map<std::string, std::string> old(before.begin(), before.end());
  int64_t bytes = 0;
  for (const auto& [key, value] : after) {
    auto it = old.find(key);
    if (it == old.end() || it->second != value) bytes += key.size() + value.size();
  }
  return bytes;
}

std::vector<v1::Member> ManyMembers(int n) {
  std::vector<v1::Member> members;
  for (int r = 0; r < n; ++r) {
    members.push_back(MemberWithRank(r, absl::StrCat("node-", r)));
  }
  return members;
}

TEST_F(JobManagerTest, AMemberChangeWritesTheChangeNotTheJob) {
  constexpr int kMembers = 20000;
  ASSERT_TRUE(jobs_.Create(Config("big", kMembers)).ok());
  ASSERT_TRUE(jobs_.RecordRoundClosed("big", 1, v1::BACKEND_GLOO,
                                      ManyMembers(kMembers)).ok());
  const auto scan = [&] { return storage_.Scan("jobs/", false).value(); };
  std::vector<Storage::Entry> closed = scan();
  for (const auto& [key, value] : closed) {  // chunks stay far below etcd's limit
    EXPECT_LT(value.size(), 256u * 1024) << key;
  }
  EXPECT_GT(closed.size(), 2u);

  HealthUpdate exited;
  exited.members.push_back({kMembers / 2, v1::MEMBER_STATE_EXITED, "succeeded"});
  ASSERT_TRUE(jobs_.RecordHealth("big", 1, exited).ok());
  std::vector<Storage::Entry> after = scan();
  EXPECT_LT(BytesWritten(closed, after), 200);
  EXPECT_EQ(storage_.Get("jobs/big").value(),
            closed[0].second);  // the record itself is not rewritten

  HealthUpdate lost;
  lost.members.push_back({3, v1::MEMBER_STATE_LOST, "missed 3 heartbeats"});
  lost.job_state = v1::JOB_STATE_DEGRADED;
  lost.reason = "rank 3 lost";
  ASSERT_TRUE(jobs_.RecordHealth("big", 1, lost).ok());
  // The job's state changed: the record (without members) and the change.
  EXPECT_LT(BytesWritten(after, scan()), 600);
}

TEST_F(JobManagerTest, ALoadedRecordEqualsTheLiveOneAfterEveryKindOfChange) {
  ASSERT_TRUE(jobs_.Create(Config("train", 1, 4)).ok());
  ASSERT_TRUE(jobs_.RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                                      ManyMembers(4)).ok());
  const auto reloaded_equals_live = [&](const char* after) {
    JobManager reloaded(&storage_, &clock_);
    ASSERT_TRUE(reloaded.LoadFromStorage().ok()) << after;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
        jobs_.Get("train").value(), reloaded.Get("train").value()))
        << after << ":\n" << reloaded.Get("train")->DebugString();
  };
  reloaded_equals_live("the close");
  for (int r : {2, 0, 2}) {  // rank 2 changes twice: the later one counts
    clock_.Advance(absl::Seconds(1));
    HealthUpdate update;
    update.members.push_back({r, v1::MEMBER_STATE_EXITED, absl::StrCat("r", r)});
    ASSERT_TRUE(jobs_.RecordHealth("train", 1, update).ok());
  }
  reloaded_equals_live("three member changes");
  HealthUpdate lost;
  lost.members.push_back({1, v1::MEMBER_STATE_LOST, "stream broke"});
  lost.job_state = v1::JOB_STATE_DEGRADED;
  ASSERT_TRUE(jobs_.RecordHealth("train", 1, lost).ok());
  ASSERT_TRUE(jobs_.RecordRoundSuperseded("train", "rank 1 lost").ok());
  reloaded_equals_live("a superseded round");
  v1::Recovery recovery;
  recovery.set_new_round(2);
  ASSERT_TRUE(jobs_.RecordRoundClosed("train", 2, v1::BACKEND_GLOO,
                                      ManyMembers(3), &recovery).ok());
  v1::RoundStartTimings timings;
  timings.mutable_first_step()->set_seconds(2);
  ASSERT_TRUE(jobs_.RecordRoundStart("train", 2, timings).ok());
  HealthUpdate exited;
  exited.members.push_back({0, v1::MEMBER_STATE_EXITED, "succeeded"});
  ASSERT_TRUE(jobs_.RecordHealth("train", 2, exited).ok());
  ASSERT_TRUE(jobs_.SaveRoundStarts().ok());  // the coordinator's poll
  reloaded_equals_live("a recovery");
  // Round 1's parts went with it.
  const std::vector<Storage::Entry> keys = storage_.Scan("jobs/", true).value();
  for (const auto& [key, value] : keys) {
    EXPECT_THAT(key, Not(HasSubstr("/00000000000000000001/"))) << key;
  }
}

TEST_F(JobManagerTest, PartsOfARoundCloseCutShortAreIgnoredAndRemoved) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2)).ok());
  ASSERT_TRUE(jobs_.RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                                      ManyMembers(2)).ok());
  // What etcd keeps of a close of round 2 whose record was never written
  // (its batch took several commits), and of a removal cut short.
  const std::string stray =
      "jobs/train/members/00000000000000000002/00000000000000000000";
  v1::StoredMembers chunk;
  *chunk.add_members() = MemberWithRank(0, "z");
  ASSERT_TRUE(storage_.Put(stray, chunk.SerializeAsString()).ok());
  const std::string orphan =
      "jobs/gone/changes/00000000000000000001/00000000000000000000";
  ASSERT_TRUE(storage_.Put(orphan, "").ok());

  JobManager reloaded(&storage_, &clock_);
  ASSERT_TRUE(reloaded.LoadFromStorage().ok());
  absl::StatusOr<v1::JobStatus> train = reloaded.Get("train");
  ASSERT_TRUE(train.ok());
  EXPECT_EQ(train->round(), 1);
  ASSERT_EQ(train->members_size(), 2);
  EXPECT_EQ(train->members(0).node().node_id(), "node-0");
  EXPECT_FALSE(reloaded.Exists("gone"));
  EXPECT_EQ(storage_.Get(stray).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(storage_.Get(orphan).status().code(), absl::StatusCode::kNotFound);
}

// A close whose batch failed after etcd committed part of it (more chunks
// than the next attempt writes): the attempt that succeeds replaces them.
TEST_F(JobManagerTest, AFailedAttemptsPartsOfTheSameRoundAreReplaced) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2)).ok());
  ASSERT_TRUE(jobs_.RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                                      ManyMembers(2)).ok());
  v1::StoredMembers chunk;
  *chunk.add_members() = MemberWithRank(9, "stray");
  ASSERT_TRUE(storage_
                  .Put("jobs/train/members/00000000000000000002/"
                       "00000000000000000005",
                       chunk.SerializeAsString())
                  .ok());
  ASSERT_TRUE(jobs_.RecordRoundClosed("train", 2, v1::BACKEND_GLOO,
                                      ManyMembers(2)).ok());
  JobManager reloaded(&storage_, &clock_);
  ASSERT_TRUE(reloaded.LoadFromStorage().ok());
  EXPECT_EQ(reloaded.Get("train")->members_size(), 2);
}

TEST_F(JobManagerTest, ARecordOfStateFormatOneIsReadAndRewrittenInParts) {
  // Format 1 kept the members inside the record.
  v1::JobStatus old = jobs_.Create(Config("train", 2)).value();
  old.set_state(v1::JOB_STATE_RUNNING);
  old.set_round(3);
  old.set_world_size(2);
  for (v1::Member& m : ManyMembers(2)) *old.add_members() = m;
  ASSERT_TRUE(storage_.Put("jobs/train", old.SerializeAsString()).ok());

  JobManager reloaded(&storage_, &clock_);
  ASSERT_TRUE(reloaded.LoadFromStorage().ok());
  EXPECT_EQ(reloaded.Get("train")->members_size(), 2);
  v1::JobStatus record;
  ASSERT_TRUE(record.ParseFromString(storage_.Get("jobs/train").value()));
  EXPECT_EQ(record.members_size(), 0);
  // A change now is read back with the rewritten parts.
  HealthUpdate update;
  update.members.push_back({1, v1::MEMBER_STATE_EXITED, "succeeded"});
  ASSERT_TRUE(reloaded.RecordHealth("train", 3, update).ok());
  JobManager again(&storage_, &clock_);
  ASSERT_TRUE(again.LoadFromStorage().ok());
  ASSERT_EQ(again.Get("train")->members_size(), 2);
  EXPECT_EQ(again.Get("train")->members(1).state(), v1::MEMBER_STATE_EXITED);
}

TEST_F(JobManagerTest, ARecordWithoutAllItsMembersIsDataLoss) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2)).ok());
  ASSERT_TRUE(jobs_.RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                                      ManyMembers(2)).ok());
  ASSERT_TRUE(storage_.DeletePrefix("jobs/train/members/").ok());
  JobManager reloaded(&storage_, &clock_);
  absl::Status status = reloaded.LoadFromStorage();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("'jobs/train' has 0 of the 2 members"));
}

// What is learnt of a member after its job ended is kept, and stored;
// nothing else of the ended job changes.
TEST_F(JobManagerTest, AChangeAfterTheEndKeepsTheJobsEnd) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2)).ok());
  ASSERT_TRUE(
      jobs_.RecordRoundClosed("train", 1, v1::BACKEND_GLOO, ManyMembers(2))
          .ok());
  HealthUpdate lost;
  lost.members.push_back({1, v1::MEMBER_STATE_LOST, "stream broke"});
  EXPECT_EQ(jobs_.RecordAfterEnd("train", 1, lost).code(),
            absl::StatusCode::kFailedPrecondition)
      << "the job is running";
  HealthUpdate failed;
  failed.members.push_back({0, v1::MEMBER_STATE_EXITED, "exit code 1"});
  failed.members.push_back({1, v1::MEMBER_STATE_EXITED, "stopped"});
  failed.job_state = v1::JOB_STATE_FAILED;
  failed.reason = "rank 0 failed";
  ASSERT_TRUE(jobs_.RecordHealth("train", 1, failed).ok());
  const v1::JobStatus ended = jobs_.Get("train").value();
  EXPECT_EQ(jobs_.RecordAfterEnd("train", 2, lost).code(),
            absl::StatusCode::kFailedPrecondition)
      << "not the round it ended in";
  HealthUpdate restart = lost;
  restart.job_state = v1::JOB_STATE_RUNNING;
  EXPECT_EQ(jobs_.RecordAfterEnd("train", 1, restart).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs_.Get("train")->members(1).state(), v1::MEMBER_STATE_EXITED);

  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(jobs_.RecordAfterEnd("train", 1, lost).ok());
  const v1::JobStatus now = jobs_.Get("train").value();
  EXPECT_EQ(now.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(now.members(1).state_reason(), "stream broke");
  EXPECT_EQ(now.members(0).state_reason(), "exit code 1");
  EXPECT_EQ(now.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(now.reason(), "rank 0 failed");
  EXPECT_EQ(FromProtoTime(now.end_time()), FromProtoTime(ended.end_time()));
  JobManager reloaded(&storage_, &clock_);
  ASSERT_TRUE(reloaded.LoadFromStorage().ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      now, reloaded.Get("train").value()))
      << reloaded.Get("train")->DebugString();
}

TEST_F(JobManagerTest, AForgottenJobLeavesNothingInStorage) {
  ASSERT_TRUE(jobs_.Create(Config("train", 2)).ok());
  ASSERT_TRUE(jobs_.RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                                      ManyMembers(2)).ok());
  HealthUpdate done;
  done.members.push_back({0, v1::MEMBER_STATE_EXITED, "succeeded"});
  done.job_state = v1::JOB_STATE_SUCCEEDED;
  ASSERT_TRUE(jobs_.RecordHealth("train", 1, done).ok());
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(jobs_.ForgetIfEndedBefore("train", clock_.Now()));
  EXPECT_THAT(storage_.Scan("jobs/", true).value(), IsEmpty());
}

TEST_F(JobManagerTest, ASecondManagerOnTheSameStorageLoadsEveryRecord) {
  ASSERT_TRUE(jobs_.Create(Config("alpha", 1, 3)).ok());
  ASSERT_TRUE(jobs_.Create(Config("bravo")).ok());
  ASSERT_TRUE(jobs_
                  .RecordRoundClosed("alpha", 1, v1::BACKEND_NCCL,
                                     {MemberWithRank(0, "a")})
                  .ok());
  ASSERT_TRUE(jobs_.RecordRoundSuperseded("alpha", "a rejoined").ok());

  JobManager reloaded(&storage_, &clock_);
  EXPECT_FALSE(reloaded.Exists("alpha"));  // nothing until loaded
  ASSERT_TRUE(reloaded.LoadFromStorage().ok());
  EXPECT_TRUE(reloaded.Exists("alpha"));
  EXPECT_TRUE(reloaded.Exists("bravo"));
  absl::StatusOr<v1::JobStatus> alpha = reloaded.Get("alpha");
  ASSERT_TRUE(alpha.ok()) << alpha.status();
  EXPECT_EQ(alpha->config().max_nodes(), 3);
  EXPECT_EQ(alpha->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(alpha->reason(), "a rejoined");
  EXPECT_EQ(alpha->round(), 1);
  EXPECT_EQ(alpha->backend(), v1::BACKEND_NCCL);
  EXPECT_EQ(alpha->members_size(), 1);
  std::vector<v1::JobStatus> list = reloaded.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].config().job_id(), "alpha");
  EXPECT_EQ(list[1].config().job_id(), "bravo");
  // The loaded manager enforces ids as before.
  EXPECT_EQ(reloaded.Create(Config("bravo")).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(JobManagerTest, LoadFromStorageIgnoresKeysOutsideTheJobsPrefix) {
  ASSERT_TRUE(storage_.Put("kv/train/1/x", "not a job record").ok());
  ASSERT_TRUE(jobs_.Create(Config("train")).ok());
  JobManager reloaded(&storage_, &clock_);
  ASSERT_TRUE(reloaded.LoadFromStorage().ok());
  EXPECT_EQ(reloaded.List().size(), 1u);
}

TEST_F(JobManagerTest, LoadFromStorageOfACorruptRecordIsDataLoss) {
  ASSERT_TRUE(storage_.Put("jobs/broken", "\xff\xff\xff garbage").ok());
  JobManager reloaded(&storage_, &clock_);
  absl::Status status = reloaded.LoadFromStorage();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("jobs/broken"));
}

// Round-start reports come with members' heartbeats, one per member of a
// recovered round: they are kept in memory and stored by the next save,
// one write per job however many came, so that a round of 100,000 members
// does not make 100,000 commits on the heartbeat path.
TEST(JobManagerRoundStartTest, ReportsAreStoredByTheNextSaveInOneWrite) {
  testing::ControlledStorage storage;
  FakeClock clock;
  JobManager jobs(&storage, &clock);
  ASSERT_TRUE(jobs.Create(Config("train", 1, 3)).ok());
  ASSERT_TRUE(jobs.RecordRoundClosed("train", 1, v1::BACKEND_GLOO,
                                     ManyMembers(3)).ok());
  ASSERT_TRUE(jobs.RecordRoundSuperseded("train", "rank 2 lost").ok());
  v1::Recovery recovery;
  recovery.set_new_round(2);
  ASSERT_TRUE(jobs.RecordRoundClosed("train", 2, v1::BACKEND_GLOO,
                                     ManyMembers(2), &recovery).ok());
  const size_t writes = storage.batches().size();
  for (int seconds : {1, 3}) {
    v1::RoundStartTimings timings;
    timings.mutable_first_step()->set_seconds(seconds);
    ASSERT_TRUE(jobs.RecordRoundStart("train", 2, timings).ok());
  }
  EXPECT_EQ(storage.batches().size(), writes) << "written on the report";
  // Shown at once: the slowest member's first step, and both reports.
  v1::Recovery shown = jobs.Get("train")->recoveries(0);
  EXPECT_EQ(shown.round_start().first_step().seconds(), 3);
  EXPECT_EQ(shown.round_start_reports(), 2);

  ASSERT_TRUE(jobs.SaveRoundStarts().ok());
  EXPECT_EQ(storage.batches().size(), writes + 1);
  ASSERT_TRUE(jobs.SaveRoundStarts().ok());
  EXPECT_EQ(storage.batches().size(), writes + 1) << "nothing new to store";
  JobManager reloaded(&storage, &clock);
  ASSERT_TRUE(reloaded.LoadFromStorage().ok());
  EXPECT_EQ(reloaded.Get("train")->recoveries(0).round_start_reports(), 2);

  // A save that fails keeps the reports for the next one.
  v1::RoundStartTimings later;
  ASSERT_TRUE(jobs.RecordRoundStart("train", 2, later).ok());
  storage.SetFailing(true);
  const absl::Status failed = jobs.SaveRoundStarts();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("job 'train'"));
  storage.SetFailing(false);
  ASSERT_TRUE(jobs.SaveRoundStarts().ok());
  JobManager again(&storage, &clock);
  ASSERT_TRUE(again.LoadFromStorage().ok());
  EXPECT_EQ(again.Get("train")->recoveries(0).round_start_reports(), 3);
}

// Per-job locks: while job a's commit is held in storage, job b's writes and
// reads go on (with one lock for every job they waited for a's; reads of a
// wait for its commit, by design).
TEST(JobManagerIsolationTest, AJobNeverWaitsForAnotherJobsCommit) {
  testing::ControlledStorage storage;
  FakeClock clock;
  JobManager jobs(&storage, &clock);
  for (const char* id : {"a", "b"}) {
    ASSERT_TRUE(jobs.Create(Config(id, 2)).ok());
    ASSERT_TRUE(jobs.RecordRoundClosed(id, 1, v1::BACKEND_GLOO, ManyMembers(2)).ok());
  }
  HealthUpdate exited;
  exited.members.push_back({0, v1::MEMBER_STATE_EXITED, "succeeded"});
  storage.HoldPutsUnder("jobs/a/");
  std::thread a_writer([&] { EXPECT_TRUE(jobs.RecordHealth("a", 1, exited).ok()); });
  storage.AwaitHeld(1);
  absl::Notification b_done;
  std::thread b_writer([&] {
    EXPECT_TRUE(jobs.RecordHealth("b", 1, exited).ok());
    EXPECT_TRUE(jobs.Get("b").ok());
    EXPECT_TRUE(jobs.Exists("a"));
    b_done.Notify();
  });
  EXPECT_TRUE(b_done.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "job b waited for job a's commit";
  storage.Release();
  a_writer.join();
  b_writer.join();
  EXPECT_EQ(jobs.Get("a")->members(0).state(), v1::MEMBER_STATE_EXITED);
}

}  // namespace
}  // namespace gradsync
