// GrpcCoordinatorClient's call layer against scripted key-value services in
// this process (no coordinator): which errors are retried and for how long,
// what an exhausted retry says, the token on every call, and a standby's
// pointer to the leader.
#include "worker/client/grpc_coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/host_ports.h"
#include "common/leader_term.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/kv.grpc.pb.h"
#include "tests/testing/in_process_server.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Answers Get, Add and CompareAndSet from a script: each call takes the
// next status (OK answers Get with the value "v"); an empty script answers
// OK. Records each call's authorization metadata, and the request ids of
// Add and CompareAndSet.
class ScriptedKv final : public v1::KeyValue::Service {
 public:
  void Script(std::deque<grpc::Status> statuses) {
    absl::MutexLock lock(&mu_);
    script_ = std::move(statuses);
  }
  // Answers to Get carry this term stamp (common/leader_term.h), as a
  // leader's do.
  void Stamp(const std::string& stamp) {
    absl::MutexLock lock(&mu_);
    stamp_ = stamp;
  }
  // Every answer is UNAVAILABLE naming `leader` in the trailing metadata,
  // as a standby replica answers.
  void StandBy(const std::string& leader) {
    absl::MutexLock lock(&mu_);
    leader_ = leader;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::string authorization() const {
    absl::MutexLock lock(&mu_);
    return authorization_;
  }
  std::vector<std::string> request_ids() const {
    absl::MutexLock lock(&mu_);
    return request_ids_;
  }

  grpc::Status Add(grpc::ServerContext*, const v1::AddRequest* request,
                   v1::AddResponse* response) override {
    absl::MutexLock lock(&mu_);
    request_ids_.push_back(request->request_id());
    response->set_value(1);
    return NextLocked();
  }
  grpc::Status CompareAndSet(grpc::ServerContext*,
                             const v1::CompareAndSetRequest* request,
                             v1::CompareAndSetResponse* response) override {
    absl::MutexLock lock(&mu_);
    request_ids_.push_back(request->request_id());
    response->set_swapped(true);
    return NextLocked();
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest*,
                   v1::GetResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    auto auth = context->client_metadata().find("authorization");
    authorization_ = auth == context->client_metadata().end()
                         ? ""
                         : std::string(auth->second.data(), auth->second.size());
    if (!leader_.empty()) {
      context->AddTrailingMetadata(kLeaderMetadataKey, leader_);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "standing by");
    }
    grpc::Status status = grpc::Status::OK;
    if (!script_.empty()) {
      status = script_.front();
      script_.pop_front();
    }
    if (status.ok()) response->set_value("v");
    if (!stamp_.empty()) context->AddTrailingMetadata(kTermMetadataKey, stamp_);
    return status;
  }

 private:
  grpc::Status NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++calls_;
    if (script_.empty()) return grpc::Status::OK;
    grpc::Status status = script_.front();
    script_.pop_front();
    return status;
  }

  mutable absl::Mutex mu_;
  std::deque<grpc::Status> script_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> request_ids_ ABSL_GUARDED_BY(mu_);
  std::string leader_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::string authorization_ ABSL_GUARDED_BY(mu_);
};

// One ScriptedKv, served in this process.
struct KvServer {
  ScriptedKv kv;
  InProcessServer server{{&kv}};
  std::string address() const { return server.address(); }
};

class GrpcCoordinatorClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<CoordinatorClient> Client(const std::string& target,
                                            const std::string& token = "",
                                            ClientOptions options = {}) {
    options.target = target;
    options.token = token;
    options.retry.initial_backoff = absl::Milliseconds(10);
    options.retry.max_backoff = absl::Milliseconds(50);
    options.retry.budget = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
        GrpcCoordinatorClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
  static absl::StatusOr<std::string> Get(CoordinatorClient* client) {
    v1::Scope scope;
    scope.set_job_id("j");
    scope.set_round(1);
    return client->Get(scope, "k");
  }

  KvServer server_;
};

TEST_F(GrpcCoordinatorClientTest, UnavailableIsRetriedUntilAnswered) {
  server_.kv.Script({grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting"),
                     grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting")});
  std::unique_ptr<CoordinatorClient> client = Client(server_.address());
  absl::StatusOr<std::string> value = Get(client.get());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
  EXPECT_EQ(server_.kv.calls(), 3);
}

// A retry of an Add or a CompareAndSet whose answer was lost must be the
// same request to the coordinator (kv.proto's request_id): every attempt
// carries the call's id, and each call a fresh one.
TEST_F(GrpcCoordinatorClientTest, AddAndCasRetriesCarryTheCallsRequestId) {
  server_.kv.Script({grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting")});
  std::unique_ptr<CoordinatorClient> client = Client(server_.address());
  v1::Scope scope;
  scope.set_job_id("j");
  scope.set_round(1);
  ASSERT_TRUE(client->Add(scope, "n", 1).ok());
  ASSERT_TRUE(client->Add(scope, "n", 1).ok());
  server_.kv.Script({grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting")});
  v1::CompareAndSetRequest cas;
  *cas.mutable_scope() = scope;
  cas.set_key("k");
  cas.set_expect_absent(true);
  ASSERT_TRUE(client->CompareAndSet(cas).ok());
  cas.set_request_id("the-callers-own");
  ASSERT_TRUE(client->CompareAndSet(cas).ok());
  const std::vector<std::string> ids = server_.kv.request_ids();
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(ids[0].size(), 32u);
  EXPECT_EQ(ids[0], ids[1]);  // the Add and its retry
  EXPECT_NE(ids[2], ids[0]);  // the next Add
  EXPECT_EQ(ids[3], ids[4]);  // the CompareAndSet and its retry
  EXPECT_NE(ids[3], ids[0]);
  EXPECT_NE(ids[3], ids[2]);
  EXPECT_EQ(ids[5], "the-callers-own");
}

TEST_F(GrpcCoordinatorClientTest, AnAnswersTermIsToldWithTheCallsName) {
  ClientOptions options;
  std::vector<std::pair<std::string, TermStamp>> told;
  options.on_term = [&](const char* what, const TermStamp& stamp) {
    told.emplace_back(what, stamp);
  };
  std::unique_ptr<CoordinatorClient> client =
      Client(server_.address(), "", options);
  ASSERT_TRUE(Get(client.get()).ok());  // no stamp: nothing told
  server_.kv.Stamp("9 1764000000000001");
  ASSERT_TRUE(Get(client.get()).ok());
  server_.kv.Stamp("not a stamp");
  ASSERT_TRUE(Get(client.get()).ok());
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].first, "get");
  EXPECT_EQ(told[0].second.term, 9);
  EXPECT_EQ(absl::ToUnixMicros(told[0].second.answered_at), 1764000000000001);
}

TEST_F(GrpcCoordinatorClientTest, OtherErrorsAreReturnedAtOnceWithTheirCode) {
  server_.kv.Script(
      {grpc::Status(grpc::StatusCode::ABORTED, "round 1 was superseded")});
  std::unique_ptr<CoordinatorClient> client = Client(server_.address());
  absl::StatusOr<std::string> value = Get(client.get());
  EXPECT_TRUE(absl::IsAborted(value.status())) << value.status();
  EXPECT_EQ(value.status().message(), "round 1 was superseded");
  EXPECT_EQ(server_.kv.calls(), 1);
}

// Past its --transport_memory_limit, the coordinator's gRPC resets streams
// to free memory; the client sees RESOURCE_EXHAUSTED with gRPC's words for
// it and tries again. The coordinator's own RESOURCE_EXHAUSTED (a limit) is
// final.
TEST_F(GrpcCoordinatorClientTest, CallsTheTransportShedAreRetried) {
  const grpc::Status shed(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "Received RST_STREAM with error code 11");
  server_.kv.Script({shed, shed});
  std::unique_ptr<CoordinatorClient> client = Client(server_.address());
  absl::StatusOr<std::string> value = Get(client.get());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
  EXPECT_EQ(server_.kv.calls(), 3);

  server_.kv.Script({grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                  "job j holds 1000 keys (--max_keys_per_job)")});
  value = Get(client.get());
  EXPECT_TRUE(absl::IsResourceExhausted(value.status())) << value.status();
  EXPECT_EQ(value.status().message(), "job j holds 1000 keys (--max_keys_per_job)");
  EXPECT_EQ(server_.kv.calls(), 4);

  server_.kv.Script(std::deque<grpc::Status>(1000, shed));
  value = Get(client.get());
  EXPECT_TRUE(absl::IsResourceExhausted(value.status())) << value.status();
  EXPECT_THAT(value.status().message(),
              HasSubstr("kept ending the call to free memory after "));
  EXPECT_THAT(value.status().message(), HasSubstr("--transport_memory_limit"));
  EXPECT_GT(server_.kv.calls(), 6);
}

TEST_F(GrpcCoordinatorClientTest, RetriesEndWithTheBudgetAndSaySo) {
  std::deque<grpc::Status> down(
      1000, grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting"));
  server_.kv.Script(down);
  std::unique_ptr<CoordinatorClient> client = Client(server_.address());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = Get(client.get());
  EXPECT_TRUE(absl::IsUnavailable(value.status())) << value.status();
  EXPECT_THAT(value.status().message(),
              HasSubstr(absl::StrCat("get: cannot reach the coordinator at ",
                                     server_.address(), " after ")));
  EXPECT_THAT(value.status().message(), HasSubstr("restarting"));
  EXPECT_GT(server_.kv.calls(), 2);
  // The budget (1 s) bounds it, whatever the machine's load adds to a call.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST_F(GrpcCoordinatorClientTest, EveryCallCarriesTheToken) {
  std::unique_ptr<CoordinatorClient> client =
      Client(server_.address(), "s3cret");
  ASSERT_TRUE(Get(client.get()).ok());
  EXPECT_EQ(server_.kv.authorization(), "Bearer s3cret");
  std::unique_ptr<CoordinatorClient> anonymous = Client(server_.address());
  ASSERT_TRUE(Get(anonymous.get()).ok());
  EXPECT_EQ(server_.kv.authorization(), "");
}

TEST_F(GrpcCoordinatorClientTest, CallsFollowTheLeaderAStandbyNames) {
  KvServer leader;
  server_.kv.StandBy(leader.address());
  std::unique_ptr<CoordinatorClient> client = Client(server_.address());
  ASSERT_TRUE(Get(client.get()).ok());
  ASSERT_TRUE(Get(client.get()).ok());
  // The standby was asked once; from then on calls go to the leader.
  EXPECT_EQ(server_.kv.calls(), 1);
  EXPECT_EQ(leader.kv.calls(), 2);
}

TEST(GrpcCoordinatorClientCreateTest, ABadTargetIsRefused) {
  ClientOptions options;
  options.target = "no-port-here";
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      GrpcCoordinatorClient::Create(options);
  EXPECT_TRUE(absl::IsInvalidArgument(client.status())) << client.status();
}

}  // namespace
}  // namespace gradsync
