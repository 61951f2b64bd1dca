// The benchmarks' lean HTTP/2 client against a real coordinator on a
// loopback port: the answers and statuses it reports must be the server's.
#include "bench/h2_unary_client.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/kv.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "server/coordinator.h"
#include "tests/testing/ports.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kPromptly = absl::Seconds(30);
constexpr int kOk = 0;
constexpr int kInvalidArgument = 3;
constexpr int kUnimplemented = 12;

v1::JoinRequest JoinOf(const std::string& job_id, int nodes, int i) {
  v1::JoinRequest request;
  request.set_job_id(job_id);
  v1::JobConfig* config = request.mutable_config();
  config->set_job_id(job_id);
  config->set_min_nodes(nodes);
  config->set_max_nodes(nodes);
  *config->mutable_join_timeout() = ToProtoDuration(absl::Seconds(60));
  *config->mutable_last_call_timeout() = ToProtoDuration(absl::ZeroDuration());
  v1::NodeDescriptor* node = request.mutable_node();
  node->set_node_id(absl::StrCat("node-", i));
  node->set_hostname(absl::StrCat("host-", i));
  node->set_incarnation_id(absl::StrCat("incarnation-", i));
  node->set_device_type(v1::DEVICE_TYPE_CPU);
  node->set_device_count(1);
  node->add_addresses("127.0.0.1");
  return request;
}

H2UnaryClient::Call CallOf(const std::string& method,
                           const google::protobuf::Message& request) {
  H2UnaryClient::Call call;
  call.path = method;
  call.request = request.SerializeAsString();
  return call;
}

class H2UnaryClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorConfig config;
    config.listen_address = "127.0.0.1:0";
    coordinator_ = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator_->Start().ok());
    target_ = absl::StrCat("127.0.0.1:", coordinator_->port());
  }

  std::unique_ptr<H2UnaryClient> Connect(int connections) {
    auto client = H2UnaryClient::Connect(target_, connections, kPromptly);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Joins `nodes` processes to `job_id` at once over `client`; the
  // answers, by call.
  std::vector<v1::JoinResponse> JoinAll(H2UnaryClient* client,
                                        const std::string& job_id,
                                        int nodes) {
    std::vector<H2UnaryClient::Call> calls;
    for (int i = 0; i < nodes; ++i) {
      calls.push_back(
          CallOf("/gradsync.v1.Rendezvous/Join", JoinOf(job_id, nodes, i)));
    }
    EXPECT_TRUE(client->Run(&calls, kPromptly).ok());
    std::vector<v1::JoinResponse> responses(nodes);
    for (int i = 0; i < nodes; ++i) {
      EXPECT_EQ(calls[i].code, kOk) << calls[i].message;
      EXPECT_TRUE(responses[i].ParseFromString(calls[i].response));
      EXPECT_GE(calls[i].received, calls[i].sent);
    }
    return responses;
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::string target_;
};

// Many calls wait at once on each connection (the round closes only when
// the last has joined), and each gets its own answer.
TEST_F(H2UnaryClientTest, CallsWaitingTogetherEachGetTheirOwnAnswer) {
  for (int connections : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(connections, " connection(s)"));
    auto client = Connect(connections);
    ASSERT_NE(client, nullptr);
    const std::string job = absl::StrCat("job-", connections);
    std::set<int> ranks;
    for (const v1::JoinResponse& response : JoinAll(client.get(), job, 40)) {
      EXPECT_EQ(response.assignment().world_size(), 40);
      ranks.insert(response.assignment().rank());
    }
    EXPECT_EQ(ranks.size(), 40u);
    EXPECT_EQ(*ranks.begin(), 0);
    EXPECT_EQ(*ranks.rbegin(), 39);
  }
}

// A request and an answer much larger than HTTP/2's frames and the
// server's initial flow-control window go through whole, and one client
// runs several rounds of calls.
TEST_F(H2UnaryClientTest, LargeMessagesCrossFramesAndWindows) {
  auto client = Connect(2);
  ASSERT_NE(client, nullptr);
  const v1::Assignment assignment = JoinAll(client.get(), "kv", 1)[0].assignment();
  v1::SetRequest set;
  set.mutable_scope()->set_job_id("kv");
  set.mutable_scope()->set_round(assignment.round());
  set.set_key("big");
  std::string value(1 << 20, 'x');  // the largest value allowed
  for (size_t i = 0; i < value.size(); i += 4096) value[i] = 'a' + i % 26;
  set.set_value(value);
  v1::GetRequest get;
  *get.mutable_scope() = set.scope();
  get.set_key("big");

  std::vector<H2UnaryClient::Call> calls = {
      CallOf("/gradsync.v1.KeyValue/Set", set)};
  ASSERT_TRUE(client->Run(&calls, kPromptly).ok());
  ASSERT_EQ(calls[0].code, kOk) << calls[0].message;
  calls = {CallOf("/gradsync.v1.KeyValue/Get", get)};
  ASSERT_TRUE(client->Run(&calls, kPromptly).ok());
  ASSERT_EQ(calls[0].code, kOk) << calls[0].message;
  v1::GetResponse got;
  ASSERT_TRUE(got.ParseFromString(calls[0].response));
  EXPECT_TRUE(got.value() == value);
}

// The server's refusals arrive as its status code and message.
TEST_F(H2UnaryClientTest, RefusalsCarryTheServersStatus) {
  auto client = Connect(1);
  ASSERT_NE(client, nullptr);
  v1::JoinRequest no_job = JoinOf("", 1, 0);
  std::vector<H2UnaryClient::Call> calls = {
      CallOf("/gradsync.v1.Rendezvous/Join", no_job),
      CallOf("/gradsync.v1.Rendezvous/NoSuchMethod", no_job)};
  ASSERT_TRUE(client->Run(&calls, kPromptly).ok());
  EXPECT_EQ(calls[0].code, kInvalidArgument);
  EXPECT_THAT(calls[0].message, HasSubstr("job"));
  EXPECT_TRUE(calls[0].response.empty());
  EXPECT_EQ(calls[1].code, kUnimplemented);
}

// Calls still open at the timeout keep code -1, and the connections that
// still carry them take no more calls.
TEST_F(H2UnaryClientTest, ATimeoutLeavesCallsOpenAndTheClientSpent) {
  auto client = Connect(1);
  ASSERT_NE(client, nullptr);
  // One of the two nodes the job needs: the join waits.
  std::vector<H2UnaryClient::Call> calls = {
      CallOf("/gradsync.v1.Rendezvous/Join", JoinOf("waits", 2, 0))};
  absl::Status ran = client->Run(&calls, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(ran)) << ran;
  EXPECT_EQ(calls[0].code, -1);
  std::vector<H2UnaryClient::Call> more = {
      CallOf("/gradsync.v1.Rendezvous/Join", JoinOf("other", 1, 0))};
  EXPECT_TRUE(absl::IsFailedPrecondition(client->Run(&more, kPromptly)));
}

TEST(H2UnaryClientConnectTest, NoServerIsUnavailable) {
  auto client = H2UnaryClient::Connect(
      absl::StrCat("127.0.0.1:", PickUnusedPort()), 1, kPromptly);
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_TRUE(absl::IsInvalidArgument(
      H2UnaryClient::Connect("no-port", 1, kPromptly).status()));
}

}  // namespace
}  // namespace gradsync
