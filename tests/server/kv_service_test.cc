// KvService, the thin gRPC layer over KvManager, served alone in this
// process (a fake clock, in-memory storage, no coordinator): who may call
// about which job, that a refused or malformed call changes nothing, and
// that the manager's answers reach the caller with their codes.
#include "server/kv_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/leader_term.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/kv.grpc.pb.h"
#include "server/authenticator.h"
#include "server/job_manager.h"
#include "server/kv_manager.h"
#include "server/storage/in_memory_storage.h"
#include "tests/testing/in_process_server.h"

namespace gradsync {
namespace {

constexpr char kAdmin[] = "admin-secret";

class KvServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* job : {"a", "b"}) {
      v1::JobConfig config;
      config.set_job_id(job);
      ASSERT_TRUE(jobs_.Create(config).ok());
      kv_.OpenRound(job, 1);
    }
    ASSERT_TRUE(auth_.LoadFromStorage().ok());
    absl::StatusOr<std::string> token = auth_.IssueToken("a");
    ASSERT_TRUE(token.ok()) << token.status();
    token_a_ = *token;
    ASSERT_TRUE(server_.ok());
    stub_ = v1::KeyValue::NewStub(server_.Channel());
  }

  // Set through the service with `token` (none when empty).
  absl::Status Set(const std::string& token, const std::string& job,
                   int64_t round, const std::string& key) {
    grpc::ClientContext context;
    if (!token.empty()) {
      context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    }
    v1::SetRequest request;
    request.mutable_scope()->set_job_id(job);
    request.mutable_scope()->set_round(round);
    request.set_key(key);
    request.set_value("value");
    v1::SetResponse response;
    return FromGrpcStatus(stub_->Set(&context, request, &response));
  }

  InMemoryStorage storage_;
  FakeClock clock_;
  JobManager jobs_{&storage_, &clock_};
  KvManager kv_{&storage_, &clock_, &jobs_};
  Authenticator auth_{&storage_, kAdmin};
  KvService service_{&kv_, &auth_};
  std::string token_a_;
  InProcessServer server_{{&service_}};
  std::unique_ptr<v1::KeyValue::Stub> stub_;
};

TEST_F(KvServiceTest, AJobsTokenReachesOnlyItsJobsStore) {
  EXPECT_TRUE(Set(token_a_, "a", 1, "k").ok());
  EXPECT_TRUE(kv_.Get({"a", 1}, "k").ok());

  const absl::Status other_job = Set(token_a_, "b", 1, "k");
  EXPECT_TRUE(absl::IsPermissionDenied(other_job)) << other_job;
  EXPECT_EQ(other_job.message().find(token_a_), absl::string_view::npos);
  const absl::Status anonymous = Set("", "b", 1, "k");
  EXPECT_TRUE(absl::IsUnauthenticated(anonymous)) << anonymous;
  const absl::Status wrong = Set("not-a-token", "b", 1, "k");
  EXPECT_TRUE(absl::IsUnauthenticated(wrong)) << wrong;
  // None of the refused calls wrote.
  EXPECT_TRUE(absl::IsNotFound(kv_.Get({"b", 1}, "k").status()));

  EXPECT_TRUE(Set(kAdmin, "b", 1, "k").ok());  // the admin may
}

TEST_F(KvServiceTest, TheManagersAnswersReachTheCallerWithTheirCodes) {
  // A round that is not open, and a job that does not exist: the service
  // answers what the manager says, code and message.
  for (const auto& [job, round] :
       std::vector<std::pair<std::string, int64_t>>{{"a", 2}, {"c", 1}}) {
    const absl::Status direct = kv_.Set({job, round}, "k", "value");
    ASSERT_FALSE(direct.ok());
    const absl::Status served = Set(kAdmin, job, round, "k");
    EXPECT_EQ(served.code(), direct.code()) << served << " vs " << direct;
    EXPECT_EQ(served.message(), direct.message());
  }
}

TEST_F(KvServiceTest, RequestIdsReachTheManager) {
  const auto add = [&](const std::string& request_id) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kAdmin));
    v1::AddRequest request;
    request.mutable_scope()->set_job_id("a");
    request.mutable_scope()->set_round(1);
    request.set_key("n");
    request.set_delta(1);
    request.set_request_id(request_id);
    v1::AddResponse response;
    EXPECT_TRUE(stub_->Add(&context, request, &response).ok());
    return response.value();
  };
  EXPECT_EQ(add("r1"), 1);
  EXPECT_EQ(add("r1"), 1);
  EXPECT_EQ(add(""), 2);
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", kAdmin));
  v1::CompareAndSetRequest cas;
  cas.mutable_scope()->set_job_id("a");
  cas.mutable_scope()->set_round(1);
  cas.set_key("n");
  cas.set_expected("2");
  cas.set_desired("9");
  cas.set_request_id("r1");  // the Add's id: refused, naming it
  v1::CompareAndSetResponse response;
  const absl::Status reused =
      FromGrpcStatus(stub_->CompareAndSet(&context, cas, &response));
  EXPECT_TRUE(absl::IsInvalidArgument(reused)) << reused;
  EXPECT_EQ(kv_.Get({"a", 1}, "n").value(), "2");
}

// A leader's answers name its term and when they were sent; a coordinator
// that leads no term (no etcd) sends nothing.
TEST_F(KvServiceTest, ALeadersAnswersCarryItsTerm) {
  // The term stamp of a Set's answer through `channel`, if any.
  const auto stamp_of = [](const std::shared_ptr<grpc::Channel>& channel)
      -> std::optional<TermStamp> {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kAdmin));
    v1::SetRequest request;
    request.mutable_scope()->set_job_id("a");
    request.mutable_scope()->set_round(1);
    request.set_key("k");
    request.set_value("v");
    v1::SetResponse response;
    EXPECT_TRUE(v1::KeyValue::NewStub(channel)->Set(&context, request, &response).ok());
    const auto& trailers = context.GetServerTrailingMetadata();
    auto stamped = trailers.find(kTermMetadataKey);
    if (stamped == trailers.end()) return std::nullopt;
    std::optional<TermStamp> stamp = ParseTermStamp(
        absl::string_view(stamped->second.data(), stamped->second.size()));
    EXPECT_TRUE(stamp.has_value());
    return stamp;
  };
  EXPECT_FALSE(stamp_of(server_.Channel()).has_value());

  KvService leader(&kv_, &auth_, /*leader_term=*/7);
  InProcessServer leader_server({&leader});
  ASSERT_TRUE(leader_server.ok());
  const absl::Time before = absl::Now();
  std::optional<TermStamp> stamp = stamp_of(leader_server.Channel());
  ASSERT_TRUE(stamp.has_value());
  EXPECT_EQ(stamp->term, 7);
  EXPECT_GE(stamp->answered_at, before);
  EXPECT_LE(stamp->answered_at, absl::Now());
}

TEST_F(KvServiceTest, AMalformedRequestIsRefusedAndChangesNothing) {
  const absl::Status no_key = Set(kAdmin, "a", 1, "");
  EXPECT_TRUE(absl::IsInvalidArgument(no_key)) << no_key;
  const absl::Status no_job = Set(kAdmin, "", 1, "k");
  EXPECT_TRUE(absl::IsInvalidArgument(no_job)) << no_job;
  absl::StatusOr<std::vector<Storage::Entry>> listed = kv_.List({"a", 1}, "", false);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
}

}  // namespace
}  // namespace gradsync
