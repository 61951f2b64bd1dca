// Job records on a real etcd (started by the test): a job whose record is
// far larger than etcd's request limit is stored in parts, a change to one
// member is a small write, and a fresh job manager reads it all back; also
// under a small --etcd_max_request_bytes, where a round's close takes
// several etcd transactions. And a coordinator whose key-value limits etcd
// would refuse, or whose lease TTL etcd cannot grant, is refused at start,
// naming the flags.
#include <google/protobuf/util/message_differencer.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_manager.h"
#include "server/storage/open_storage.h"
#include "tests/testing/etcd_process.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class JobRecordsOnEtcdTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    if (testing::EtcdProcess::Binary().empty()) {
      GTEST_SKIP() << "no etcd binary: install etcd-server";
    }
    ASSERT_TRUE(etcd_.Start("records"));
  }

  absl::StatusOr<std::unique_ptr<Storage>> Open() {
    StorageSpec spec;
    spec.etcd = etcd_.endpoint();
    spec.etcd_prefix = "/records/";
    spec.etcd_max_request_bytes = GetParam();
    return OpenStorage(spec);
  }

  testing::EtcdProcess etcd_;
  FakeClock clock_;
};

std::vector<v1::Member> Members(int n) {
  std::vector<v1::Member> members(n);
  for (int r = 0; r < n; ++r) {
    members[r].set_rank(r);
    members[r].set_node_rank(r);
    members[r].mutable_node()->set_node_id(absl::StrCat("node-", r));
    members[r].mutable_node()->set_hostname(
        absl::StrCat("host-", r, ".a-rather-long-cluster-domain.example"));
    members[r].mutable_node()->set_incarnation_id(absl::StrFormat("%032x", r));
    members[r].set_state(v1::MEMBER_STATE_ACTIVE);
  }
  return members;
}

TEST_P(JobRecordsOnEtcdTest, AJobLargerThanEtcdsLimitIsStoredInPartsAndReadBack) {
  constexpr int kMembers = 30000;
  absl::StatusOr<std::unique_ptr<Storage>> storage = Open();
  ASSERT_TRUE(storage.ok()) << storage.status();
  JobManager jobs(storage->get(), &clock_);
  v1::JobConfig config;
  config.set_job_id("large");
  config.set_min_nodes(kMembers);
  config.set_max_nodes(kMembers);
  ASSERT_TRUE(jobs.Create(config).ok());
  ASSERT_TRUE(
      jobs.RecordRoundClosed("large", 1, v1::BACKEND_GLOO, Members(kMembers)).ok());
  const int64_t whole = static_cast<int64_t>(jobs.Get("large")->ByteSizeLong());
  EXPECT_GT(whole, 2 * GetParam()) << "the record must not fit one request";
  for (int r : {0, kMembers - 1}) {
    HealthUpdate update;
    update.members.push_back({r, v1::MEMBER_STATE_EXITED, "succeeded"});
    ASSERT_TRUE(jobs.RecordHealth("large", 1, update).ok());
  }
  // A recovery: the next round's members replace round 1's.
  ASSERT_TRUE(jobs.RecordRoundSuperseded("large", "a rank was lost").ok());
  v1::Recovery recovery;
  recovery.set_new_round(2);
  ASSERT_TRUE(jobs.RecordRoundClosed("large", 2, v1::BACKEND_GLOO,
                                     Members(kMembers - 1), &recovery)
                  .ok());
  HealthUpdate lost;
  lost.members.push_back({7, v1::MEMBER_STATE_LOST, "stream broke"});
  lost.job_state = v1::JOB_STATE_DEGRADED;
  ASSERT_TRUE(jobs.RecordHealth("large", 2, lost).ok());

  absl::StatusOr<std::unique_ptr<Storage>> again = Open();
  ASSERT_TRUE(again.ok()) << again.status();
  JobManager reloaded(again->get(), &clock_);
  ASSERT_TRUE(reloaded.LoadFromStorage().ok());
  absl::StatusOr<v1::JobStatus> back = reloaded.Get("large");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->members_size(), kMembers - 1);
  EXPECT_EQ(back->members(7).state(), v1::MEMBER_STATE_LOST);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      jobs.Get("large").value(), *back));
  // Round 1's parts are gone.
  absl::StatusOr<std::vector<Storage::Entry>> old =
      (*again)->Scan("jobs/large/members/00000000000000000001/", true);
  ASSERT_TRUE(old.ok());
  EXPECT_TRUE(old->empty());
}

// etcd's default limit, and a small one (a round's close in many commits).
INSTANTIATE_TEST_SUITE_P(Limits, JobRecordsOnEtcdTest,
                         ::testing::Values(1536 * 1024, 64 * 1024));

TEST(EtcdLimitsTest, KeyValueLimitsThatEtcdWouldRefuseAreRefusedAtStart) {
  StorageSpec spec;
  spec.etcd = "127.0.0.1:1";  // never reached: refused before connecting
  spec.etcd_max_request_bytes = 1536 * 1024;
  spec.largest_client_write_bytes = 1024 + (2 << 20);
  absl::StatusOr<std::unique_ptr<Storage>> opened = OpenStorage(spec);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(), HasSubstr("--max_kv_value_bytes"));
  EXPECT_THAT(opened.status().message(), HasSubstr("--etcd_max_request_bytes"));
  // The defaults fit; a leader lease's TTL is whole seconds, 2 to 8.
  spec.largest_client_write_bytes = 1024 + (1 << 20);
  for (absl::Duration ttl :
       {absl::Seconds(1), absl::Milliseconds(2500), absl::Seconds(9)}) {
    spec.lease_ttl = ttl;
    EXPECT_THAT(OpenStorage(spec).status().message(),
                HasSubstr("--etcd_lease_ttl must be whole seconds"));
  }
  spec.lease_ttl = absl::Seconds(5);
  spec.etcd = "not-an-endpoint";
  EXPECT_THAT(OpenStorage(spec).status().message(), Not(HasSubstr("--max_kv")));
}

}  // namespace
}  // namespace gradsync
