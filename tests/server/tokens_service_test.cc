// TokensService served alone in this process: only the admin rotates or
// revokes, a rotated token replaces the old one, a revoked job has none, and
// a coordinator without tokens says it has none to rotate.
#include "server/tokens_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/tokens.grpc.pb.h"
#include "server/authenticator.h"
#include "server/job_manager.h"
#include "server/storage/in_memory_storage.h"
#include "tests/testing/in_process_server.h"

namespace gradsync {
namespace {

constexpr char kAdmin[] = "admin-secret";

class TokensServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::JobConfig config;
    config.set_job_id("train");
    ASSERT_TRUE(jobs_.Create(config).ok());
    ASSERT_TRUE(auth_.LoadFromStorage().ok());
    ASSERT_TRUE(server_.ok());
  }

  absl::StatusOr<std::string> Rotate(const std::string& token,
                                     const std::string& job_id) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::RotateTokenRequest request;
    request.set_job_id(job_id);
    v1::RotateTokenResponse response;
    absl::Status status =
        FromGrpcStatus(stub_->RotateToken(&context, request, &response));
    if (!status.ok()) return status;
    return response.token();
  }
  absl::Status Revoke(const std::string& token, const std::string& job_id) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::RevokeTokenRequest request;
    request.set_job_id(job_id);
    v1::RevokeTokenResponse response;
    return FromGrpcStatus(stub_->RevokeToken(&context, request, &response));
  }
  // Whether `token` authenticates as job "train".
  bool IsTrainsToken(const std::string& token) {
    const std::string header = absl::StrCat("Bearer ", token);
    absl::StatusOr<Caller> caller = auth_.Identify(&header);
    return caller.ok() && !caller->admin && caller->job_id == "train";
  }

  InMemoryStorage storage_;
  FakeClock clock_;
  JobManager jobs_{&storage_, &clock_};
  Authenticator auth_{&storage_, kAdmin};
  TokensService service_{&jobs_, &auth_};
  InProcessServer server_{{&service_}};
  std::unique_ptr<v1::Tokens::Stub> stub_ =
      v1::Tokens::NewStub(server_.Channel());
};

TEST_F(TokensServiceTest, TheAdminRotatesAndTheOldTokenStopsWorking) {
  absl::StatusOr<std::string> first = Rotate(kAdmin, "train");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(IsTrainsToken(*first));
  absl::StatusOr<std::string> second = Rotate(kAdmin, "train");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);
  EXPECT_FALSE(IsTrainsToken(*first));
  EXPECT_TRUE(IsTrainsToken(*second));

  EXPECT_TRUE(Revoke(kAdmin, "train").ok());
  EXPECT_FALSE(IsTrainsToken(*second));
}

TEST_F(TokensServiceTest, OnlyTheAdminMayAndOnlyForAJobThatExists) {
  absl::StatusOr<std::string> job_token = auth_.IssueToken("train");
  ASSERT_TRUE(job_token.ok());
  const absl::Status by_job = Rotate(*job_token, "train").status();
  EXPECT_TRUE(absl::IsPermissionDenied(by_job)) << by_job;
  EXPECT_TRUE(IsTrainsToken(*job_token));  // unchanged
  const absl::Status revoked_by_job = Revoke(*job_token, "train");
  EXPECT_TRUE(absl::IsPermissionDenied(revoked_by_job)) << revoked_by_job;
  EXPECT_TRUE(IsTrainsToken(*job_token));
  const absl::Status unknown = Rotate("not-a-token", "train").status();
  EXPECT_TRUE(absl::IsUnauthenticated(unknown)) << unknown;

  const absl::Status no_job = Rotate(kAdmin, "nowhere").status();
  EXPECT_TRUE(absl::IsNotFound(no_job)) << no_job;
  const absl::Status bad_id = Rotate(kAdmin, "").status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad_id)) << bad_id;
}

TEST(TokensServiceWithoutTokensTest, SaysThereAreNoTokens) {
  InMemoryStorage storage;
  FakeClock clock;
  JobManager jobs{&storage, &clock};
  Authenticator auth{&storage, ""};  // --auth=none: every caller is the admin
  TokensService service{&jobs, &auth};
  InProcessServer server({&service});
  v1::JobConfig config;
  config.set_job_id("train");
  ASSERT_TRUE(jobs.Create(config).ok());
  grpc::ClientContext context;
  v1::RotateTokenRequest request;
  request.set_job_id("train");
  v1::RotateTokenResponse response;
  const absl::Status status = FromGrpcStatus(
      v1::Tokens::NewStub(server.Channel())
          ->RotateToken(&context, request, &response));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("without tokens"), absl::string_view::npos);
}

}  // namespace
}  // namespace gradsync
