// End-to-end tests of the coordinator: a real Coordinator serving gRPC on a
// loopback port, driven through CoordinatorClient and, where a test needs to
// send exactly what it wants, raw gRPC stubs.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "proto/gradsync/v1/kv.grpc.pb.h"
#include "proto/gradsync/v1/rendezvous.grpc.pb.h"
#include "server/coordinator.h"
#include "server/storage/in_memory_storage.h"
#include "tests/testing/eventually.h"
#include "tests/testing/ports.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// How long a test waits for something that should happen at once.
constexpr absl::Duration kPromptly = absl::Seconds(5);
// The fixture's shutdown grace: long, so that a call left in flight on the
// server makes Shutdown() visibly slow (see ExpectPromptShutdown).
constexpr absl::Duration kLongGrace = absl::Seconds(20);
constexpr int64_t kMiB = 1 << 20;
// How long Eventually waits for what the coordinator does at once: a bound
// for a loaded machine, not a claim about speed (kPromptly is that).
constexpr absl::Duration kSoon = absl::Seconds(30);


v1::JobConfig Config(const std::string& job_id, int min_nodes, int max_nodes,
                     absl::Duration join_timeout = absl::Seconds(60)) {
  v1::JobConfig config;
  config.set_job_id(job_id);
  config.set_min_nodes(min_nodes);
  config.set_max_nodes(max_nodes);
  *config.mutable_join_timeout() = ToProtoDuration(join_timeout);
  // Close as soon as min_nodes are in: tests never wait for a last call.
  *config.mutable_last_call_timeout() = ToProtoDuration(absl::ZeroDuration());
  return config;
}

v1::NodeDescriptor Node(const std::string& node_id) {
  v1::NodeDescriptor node = LocalNodeDescriptor();
  node.set_node_id(node_id);
  node.add_addresses("127.0.0.1");
  return node;
}

v1::NodeDescriptor CudaNode(const std::string& node_id) {
  v1::NodeDescriptor node = Node(node_id);
  node.set_device_type(v1::DEVICE_TYPE_CUDA);
  node.set_device_count(1);
  node.set_nccl_available(true);
  return node;
}

v1::JoinRequest JoinRequestFor(const v1::JobConfig& config,
                               v1::NodeDescriptor node,
                               int64_t last_round = 0) {
  v1::JoinRequest request;
  request.set_job_id(config.job_id());
  *request.mutable_config() = config;
  *request.mutable_node() = std::move(node);
  request.set_last_round(last_round);
  return request;
}

// A node join of `nproc` processes on node `node_id` (fresh incarnations).
v1::JoinNodeRequest JoinNodeRequestFor(const v1::JobConfig& config,
                                       const std::string& node_id, int nproc) {
  v1::JoinNodeRequest request;
  request.set_job_id(config.job_id());
  *request.mutable_config() = config;
  for (int i = 0; i < nproc; ++i) {
    *request.add_processes()->mutable_node() = Node(node_id);
  }
  return request;
}

v1::Scope ScopeOf(const std::string& job_id, int64_t round) {
  v1::Scope scope;
  scope.set_job_id(job_id);
  scope.set_round(round);
  return scope;
}

v1::Scope ScopeOf(const v1::Assignment& a) {
  return ScopeOf(a.job_id(), a.round());
}

// One blocking unary call on a raw stub with a deadline.
template <typename Stub, typename Request, typename Response>
grpc::Status RawCall(Stub* stub,
                     grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                  const Request&, Response*),
                     const Request& request, Response* response,
                     absl::Duration timeout = absl::Seconds(10)) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return (stub->*method)(&context, request, response);
}

// Runs `body` on its own thread; Wait() joins it with a bound.
class Background {
 public:
  explicit Background(std::function<void()> body)
      : thread_([this, body = std::move(body)] {
          body();
          done_.Notify();
        }) {}
  ~Background() {
    if (thread_.joinable()) thread_.join();
  }
  // True when the body finished within `bound` (the thread is joined then).
  bool Wait(absl::Duration bound = kPromptly) {
    if (!done_.WaitForNotificationWithTimeout(bound)) return false;
    thread_.join();
    return true;
  }
  bool done() const { return done_.HasBeenNotified(); }

 private:
  absl::Notification done_;
  std::thread thread_;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_ = StartCoordinator("127.0.0.1:0", kLongGrace);
    ASSERT_NE(coordinator_, nullptr);
    target_ = absl::StrCat("127.0.0.1:", coordinator_->port());
    channel_ = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
    rendezvous_ = v1::Rendezvous::NewStub(channel_);
    kv_ = v1::KeyValue::NewStub(channel_);
    jobs_ = v1::Jobs::NewStub(channel_);
    client_ = NewClient();
  }

  void TearDown() override {
    // Every test leaves no call in flight, so this is quick despite the
    // long grace.
    if (coordinator_ != nullptr) ExpectPromptShutdown();
  }

  static std::unique_ptr<Coordinator> StartCoordinator(
      const std::string& address, absl::Duration grace) {
    CoordinatorConfig config;
    config.listen_address = address;
    config.poll_interval = absl::Milliseconds(5);
    config.shutdown_grace = grace;
    auto coordinator = std::make_unique<Coordinator>(config);
    absl::Status started = coordinator->Start();
    EXPECT_TRUE(started.ok()) << started;
    if (!started.ok()) return nullptr;
    return coordinator;
  }

  ClientOptions Options(const std::string& target) const {
    ClientOptions options;
    options.target = target;
    options.call_timeout = absl::Seconds(10);
    return options;
  }

  std::unique_ptr<CoordinatorClient> NewClient(int max_attempts = 10) {
    ClientOptions options = Options(target_);
    options.retry.max_attempts = max_attempts;
    auto client = GrpcCoordinatorClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Shutdown() of a coordinator whose grace is kLongGrace returns at once
  // only when no call is in flight on the server: a call the server still
  // holds (e.g. a wait it did not withdraw) keeps it waiting for the grace.
  // Should a call never finish, Shutdown() would block for good: it runs on
  // its own thread, and a coordinator stuck in it is leaked so that the test
  // fails instead of hanging.
  void ExpectPromptShutdown() {
    Coordinator* coordinator = coordinator_.get();
    auto done = std::make_shared<absl::Notification>();
    std::thread([coordinator, done] {
      coordinator->Shutdown();
      done->Notify();
    }).detach();
    if (!done->WaitForNotificationWithTimeout(kPromptly)) {
      ADD_FAILURE() << "Shutdown() did not return within "
                    << absl::FormatDuration(kPromptly)
                    << ": the server still had calls in flight";
      coordinator_.release();  // still in use by the stuck thread
    }
  }

  absl::StatusOr<v1::JobStatus> GetJob(const std::string& job_id) {
    return client_->GetJob(job_id);
  }

  // The serialized ListJobs answer, to compare server state before/after.
  std::string ListJobsSnapshot() {
    v1::ListJobsResponse response;
    grpc::Status status = RawCall(jobs_.get(), &v1::Jobs::Stub::ListJobs,
                                  v1::ListJobsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.SerializeAsString();
  }

  int WaitingCount(const std::string& job_id) {
    auto job = GetJob(job_id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->waiting_size() : -1;
  }

  // Joins a one-node job (which closes its round at once) and returns the
  // assignment.
  v1::Assignment RunSingleNodeJob(const std::string& job_id,
                                  v1::NodeDescriptor* node_out = nullptr) {
    v1::NodeDescriptor node = Node(job_id + "-node");
    if (node_out != nullptr) *node_out = node;
    auto a = client_->Join(JoinRequestFor(Config(job_id, 1, 1), node));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : v1::Assignment();
  }

  grpc::Status RawJoin(const v1::JoinRequest& request,
                       v1::JoinResponse* response = nullptr) {
    v1::JoinResponse ignored;
    return RawCall(rendezvous_.get(), &v1::Rendezvous::Stub::Join, request,
                   response != nullptr ? response : &ignored);
  }

  grpc::Status RawLeave(const std::string& job_id,
                        const std::string& incarnation_id) {
    v1::LeaveRequest request;
    request.set_job_id(job_id);
    request.set_incarnation_id(incarnation_id);
    v1::LeaveResponse response;
    return RawCall(rendezvous_.get(), &v1::Rendezvous::Stub::Leave, request,
                   &response);
  }

  grpc::Status RawCreateJob(const v1::JobConfig& config,
                            v1::CreateJobResponse* response = nullptr) {
    v1::CreateJobRequest request;
    *request.mutable_config() = config;
    v1::CreateJobResponse ignored;
    return RawCall(jobs_.get(), &v1::Jobs::Stub::CreateJob, request,
                   response != nullptr ? response : &ignored);
  }

  grpc::Status RawGetJob(const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::GetJobResponse response;
    return RawCall(jobs_.get(), &v1::Jobs::Stub::GetJob, request, &response);
  }

  // Every KeyValue method, as one call with a scope and a key (the prefix,
  // for List; the one awaited key, for Wait).
  struct KvMethod {
    std::string name;
    std::function<grpc::Status(const v1::Scope&, const std::string&)> call;
  };
  std::vector<KvMethod> KvMethods() {
    v1::KeyValue::Stub* kv = kv_.get();
    return {
        {"Set",
         [kv](const v1::Scope& scope, const std::string& key) {
           v1::SetRequest r;
           *r.mutable_scope() = scope;
           r.set_key(key);
           r.set_value("value");
           v1::SetResponse response;
           return RawCall(kv, &v1::KeyValue::Stub::Set, r, &response);
         }},
        {"Get",
         [kv](const v1::Scope& scope, const std::string& key) {
           v1::GetRequest r;
           *r.mutable_scope() = scope;
           r.set_key(key);
           v1::GetResponse response;
           return RawCall(kv, &v1::KeyValue::Stub::Get, r, &response);
         }},
        {"Add",
         [kv](const v1::Scope& scope, const std::string& key) {
           v1::AddRequest r;
           *r.mutable_scope() = scope;
           r.set_key(key);
           r.set_delta(1);
           v1::AddResponse response;
           return RawCall(kv, &v1::KeyValue::Stub::Add, r, &response);
         }},
        {"CompareAndSet",
         [kv](const v1::Scope& scope, const std::string& key) {
           v1::CompareAndSetRequest r;
           *r.mutable_scope() = scope;
           r.set_key(key);
           r.set_expect_absent(true);
           r.set_desired("desired");
           v1::CompareAndSetResponse response;
           return RawCall(kv, &v1::KeyValue::Stub::CompareAndSet, r, &response);
         }},
        {"Wait",
         [kv](const v1::Scope& scope, const std::string& key) {
           v1::WaitRequest r;
           *r.mutable_scope() = scope;
           r.add_keys(key);
           r.set_timeout_ms(2000);
           v1::WaitResponse response;
           return RawCall(kv, &v1::KeyValue::Stub::Wait, r, &response);
         }},
        {"Delete",
         [kv](const v1::Scope& scope, const std::string& key) {
           v1::DeleteRequest r;
           *r.mutable_scope() = scope;
           r.set_key(key);
           v1::DeleteResponse response;
           return RawCall(kv, &v1::KeyValue::Stub::Delete, r, &response);
         }},
        {"List",
         [kv](const v1::Scope& scope, const std::string& key) {
           v1::ListRequest r;
           *r.mutable_scope() = scope;
           r.set_prefix(key);
           v1::ListResponse response;
           return RawCall(kv, &v1::KeyValue::Stub::List, r, &response);
         }},
    };
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> rendezvous_;
  std::unique_ptr<v1::KeyValue::Stub> kv_;
  std::unique_ptr<v1::Jobs::Stub> jobs_;
  std::unique_ptr<CoordinatorClient> client_;
};

// ---------------------------------------------------------------------------
// Many concurrent clients

TEST_F(CoordinatorTest, TwoHundredConcurrentClientsJoinAndBootstrap) {
  constexpr int kNodes = 200;
  const v1::JobConfig config = Config("swarm", kNodes, kNodes);
  struct Outcome {
    absl::Status status;
    v1::Assignment assignment;
    int64_t barrier = 0;
    bool leader = false;
    size_t listed = 0;
    std::string peer_address;
  };
  std::vector<Outcome> outcomes(kNodes);
  const absl::Time start = absl::Now();
  {
    std::vector<std::thread> threads;
    threads.reserve(kNodes);
    for (int i = 0; i < kNodes; ++i) {
      threads.emplace_back([&, i] {
        Outcome& out = outcomes[i];
        // Each thread has its own client (channel), like separate workers.
        auto created = GrpcCoordinatorClient::Create(Options(target_));
        if (!created.ok()) {
          out.status = created.status();
          return;
        }
        CoordinatorClient& client = **created;
        auto a =
            client.Join(JoinRequestFor(config, Node(absl::StrCat("node-", i))),
                        absl::Seconds(60));
        if (!a.ok()) {
          out.status = a.status();
          return;
        }
        out.assignment = *a;
        const v1::Scope scope = ScopeOf(*a);
        // The bootstrap a backend does: publish, wait for all, barrier.
        out.status = client.Set(scope, absl::StrCat("addr/", a->rank()),
                                absl::StrCat("127.0.0.1:", 30000 + a->rank()));
        if (!out.status.ok()) return;
        std::vector<std::string> keys;
        for (int r = 0; r < a->world_size(); ++r) {
          keys.push_back(absl::StrCat("addr/", r));
        }
        out.status = client.Wait(scope, keys, absl::Seconds(60));
        if (!out.status.ok()) return;
        auto peer = client.Get(
            scope, absl::StrCat("addr/", (a->rank() + 1) % a->world_size()));
        if (!peer.ok()) {
          out.status = peer.status();
          return;
        }
        out.peer_address = *peer;
        auto listed = client.List(scope, "addr/", /*keys_only=*/true);
        if (!listed.ok()) {
          out.status = listed.status();
          return;
        }
        out.listed = listed->size();
        v1::CompareAndSetRequest cas;
        *cas.mutable_scope() = scope;
        cas.set_key("leader");
        cas.set_expect_absent(true);
        cas.set_desired(absl::StrCat(a->rank()));
        auto swapped = client.CompareAndSet(cas);
        if (!swapped.ok()) {
          out.status = swapped.status();
          return;
        }
        out.leader = swapped->swapped();
        auto arrived = client.Add(scope, "barrier", 1);
        if (!arrived.ok()) {
          out.status = arrived.status();
          return;
        }
        out.barrier = *arrived;
      });
    }
    for (std::thread& t : threads) t.join();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));

  std::set<int> ranks;
  std::set<int64_t> barrier_values;
  int leaders = 0;
  for (int i = 0; i < kNodes; ++i) {
    const Outcome& out = outcomes[i];
    ASSERT_TRUE(out.status.ok()) << "client " << i << ": " << out.status;
    const v1::Assignment& a = out.assignment;
    EXPECT_EQ(a.job_id(), "swarm");
    EXPECT_EQ(a.round(), 1);
    EXPECT_EQ(a.world_size(), kNodes);
    EXPECT_EQ(a.num_nodes(), kNodes);
    EXPECT_EQ(a.local_rank(), 0);
    EXPECT_EQ(a.local_world_size(), 1);
    EXPECT_EQ(a.node_rank(), a.rank());
    EXPECT_EQ(a.backend(), v1::BACKEND_GLOO);
    EXPECT_EQ(a.kv_prefix(), outcomes[0].assignment.kv_prefix());
    EXPECT_EQ(
        out.peer_address,
        absl::StrCat("127.0.0.1:", 30000 + (a.rank() + 1) % a.world_size()));
    EXPECT_EQ(out.listed, static_cast<size_t>(kNodes));
    ranks.insert(a.rank());
    barrier_values.insert(out.barrier);
    leaders += out.leader ? 1 : 0;
  }
  // Ranks 0..199, each exactly once.
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kNodes));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), kNodes - 1);
  // The counter is atomic: every client saw a different value, 1..200.
  ASSERT_EQ(barrier_values.size(), static_cast<size_t>(kNodes));
  EXPECT_EQ(*barrier_values.begin(), 1);
  EXPECT_EQ(*barrier_values.rbegin(), kNodes);
  EXPECT_EQ(leaders, 1);
  auto barrier = client_->Get(ScopeOf("swarm", 1), "barrier");
  ASSERT_TRUE(barrier.ok()) << barrier.status();
  EXPECT_EQ(*barrier, "200");

  auto job = GetJob("swarm");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->round(), 1);
  EXPECT_EQ(job->world_size(), kNodes);
  ASSERT_EQ(job->members_size(), kNodes);
  for (int r = 0; r < kNodes; ++r) {
    EXPECT_EQ(job->members(r).rank(), r);
    EXPECT_EQ(job->members(r).state(), v1::MEMBER_STATE_ACTIVE);
  }
  EXPECT_THAT(job->waiting(), IsEmpty());
  EXPECT_THAT(job->spares(), IsEmpty());
}

// ---------------------------------------------------------------------------
// Bad input: Rendezvous.Join

TEST_F(CoordinatorTest, JoinRejectsInvalidArguments) {
  ASSERT_TRUE(client_->CreateJob(Config("existing", 2, 2)).ok());
  const std::string before = ListJobsSnapshot();

  struct Case {
    std::string name;
    v1::JoinRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  auto base = [] { return JoinRequestFor(Config("fresh", 1, 1), Node("n")); };
  {
    Case c{"bad job id", base(), "not a DNS label"};
    c.request.set_job_id("Bad_Job");
    c.request.mutable_config()->set_job_id("Bad_Job");
    cases.push_back(c);
  }
  {
    Case c{"empty job id", base(), "job id is empty"};
    c.request.clear_job_id();
    c.request.mutable_config()->clear_job_id();
    cases.push_back(c);
  }
  {
    Case c{"64-character job id", base(), "not a DNS label"};
    c.request.set_job_id(std::string(64, 'a'));
    c.request.mutable_config()->set_job_id(std::string(64, 'a'));
    cases.push_back(c);
  }
  {
    Case c{"missing incarnation", base(), "incarnation_id"};
    c.request.mutable_node()->clear_incarnation_id();
    cases.push_back(c);
  }
  {
    Case c{"missing incarnation, existing job", base(), "incarnation_id"};
    c.request.set_job_id("existing");
    c.request.clear_config();
    c.request.mutable_node()->clear_incarnation_id();
    cases.push_back(c);
  }
  {
    Case c{"no node id or hostname", base(), "node_id or a hostname"};
    c.request.mutable_node()->clear_node_id();
    c.request.mutable_node()->clear_hostname();
    cases.push_back(c);
  }
  {
    Case c{"negative pid", base(), "pid"};
    c.request.mutable_node()->set_pid(-1);
    cases.push_back(c);
  }
  {
    Case c{"negative device count", base(), "device_count"};
    c.request.mutable_node()->set_device_count(-1);
    cases.push_back(c);
  }
  {
    Case c{"min nodes above max", base(), "MIN <= MAX"};
    c.request.mutable_config()->set_min_nodes(3);
    c.request.mutable_config()->set_max_nodes(2);
    cases.push_back(c);
  }
  {
    Case c{"negative join timeout", base(), "join_timeout"};
    *c.request.mutable_config()->mutable_join_timeout() =
        ToProtoDuration(absl::Seconds(-1));
    cases.push_back(c);
  }
  {
    Case c{"config names another job", base(), "config names job 'other'"};
    c.request.mutable_config()->set_job_id("other");
    cases.push_back(c);
  }
  {
    // Invalid settings are reported as such even when the node also could
    // not run the NCCL they ask for.
    Case c{"min nodes above max, NCCL from a CPU node", base(), "MIN <= MAX"};
    c.request.mutable_config()->set_min_nodes(3);
    c.request.mutable_config()->set_max_nodes(2);
    c.request.mutable_config()->set_backend(v1::BACKEND_NCCL);
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    grpc::Status status = RawJoin(c.request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  // None of them created a job or left a process waiting.
  EXPECT_EQ(ListJobsSnapshot(), before);
  EXPECT_EQ(WaitingCount("existing"), 0);
}

TEST_F(CoordinatorTest, JoinOfUnknownJobWithoutConfigIsNotFound) {
  v1::JoinRequest request;
  request.set_job_id("nobody-made-this");
  *request.mutable_node() = Node("n");
  const std::string before = ListJobsSnapshot();
  grpc::Status status = RawJoin(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("does not exist"));
  EXPECT_EQ(ListJobsSnapshot(), before);
}

TEST_F(CoordinatorTest, JoinWithADifferentConfigIsFailedPrecondition) {
  auto created = client_->CreateJob(Config("fixed", 1, 2));
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string before = ListJobsSnapshot();

  grpc::Status status =
      RawJoin(JoinRequestFor(Config("fixed", 1, 3), Node("n")));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("different config"));
  // Nothing changed: the job keeps its config and nobody waits.
  EXPECT_EQ(ListJobsSnapshot(), before);
  EXPECT_EQ(WaitingCount("fixed"), 0);

  // A join that leaves the config out uses the job's.
  v1::JoinRequest bare;
  bare.set_job_id("fixed");
  *bare.mutable_node() = Node("n");
  auto a = client_->Join(bare, absl::Seconds(30));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->world_size(), 1);
}

TEST_F(CoordinatorTest, NcclJobRefusesCpuNodeWithoutSideEffects) {
  v1::JobConfig config = Config("gpus-only", 1, 1);
  config.set_backend(v1::BACKEND_NCCL);
  ASSERT_TRUE(client_->CreateJob(config).ok());
  const std::string before = ListJobsSnapshot();

  grpc::Status status = RawJoin(JoinRequestFor(config, Node("cpu-box")));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("requires the nccl backend"));
  EXPECT_EQ(ListJobsSnapshot(), before);
  EXPECT_EQ(WaitingCount("gpus-only"), 0);

  // A GPU node with NCCL is welcome and gets NCCL.
  auto a = client_->Join(JoinRequestFor(config, CudaNode("gpu-box")));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->backend(), v1::BACKEND_NCCL);
}

TEST_F(CoordinatorTest, RefusedNcclJoinDoesNotCreateTheJob) {
  // The first join of a job creates it, unless the join is refused: a CPU
  // node asking for NCCL must leave nothing behind, so that its retry with
  // another backend is not refused as a config mismatch.
  v1::JobConfig nccl = Config("first-try", 1, 1);
  nccl.set_backend(v1::BACKEND_NCCL);
  const std::string before = ListJobsSnapshot();
  grpc::Status status = RawJoin(JoinRequestFor(nccl, Node("cpu-box")));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("requires the nccl backend"));
  EXPECT_EQ(ListJobsSnapshot(), before);
  EXPECT_EQ(RawGetJob("first-try").error_code(), grpc::StatusCode::NOT_FOUND);

  v1::JobConfig gloo = nccl;
  gloo.set_backend(v1::BACKEND_GLOO);
  auto a = client_->Join(JoinRequestFor(gloo, Node("cpu-box")));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->backend(), v1::BACKEND_GLOO);
}

TEST_F(CoordinatorTest, JoinTimesOutWithDeadlineExceeded) {
  const absl::Time start = absl::Now();
  auto a = client_->Join(JoinRequestFor(
      Config("lonely", 2, 2, absl::Milliseconds(200)), Node("only-one")));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded)
      << a.status();
  // The coordinator's own timeout answered, not the client's deadline.
  EXPECT_THAT(a.status().message(), HasSubstr("needs at least 2 node(s)"));
  EXPECT_GE(took, absl::Milliseconds(190));
  EXPECT_LT(took, kPromptly);
  auto job = GetJob("lonely");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->waiting(), IsEmpty());
  EXPECT_EQ(job->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(job->round(), 0);
}

// ---------------------------------------------------------------------------
// Bad input: Rendezvous.Leave

TEST_F(CoordinatorTest, LeaveRejectsBadInput) {
  EXPECT_EQ(RawLeave("Bad_Job", "inc").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RawLeave("", "inc").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RawLeave("some-job", "").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RawLeave("some-job", std::string(129, 'x')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RawLeave("no-such-job", "inc").error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A member of a running round is not waiting: NOT_FOUND.
  v1::NodeDescriptor member;
  RunSingleNodeJob("solo", &member);
  EXPECT_EQ(RawLeave("solo", member.incarnation_id()).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(RawLeave("solo", "never-joined").error_code(),
            grpc::StatusCode::NOT_FOUND);
  auto job = GetJob("solo");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->world_size(), 1);
}

TEST_F(CoordinatorTest, LeaveEndsAWaitingJoinWithCancelled) {
  const v1::JobConfig config = Config("pair", 2, 2);
  const v1::NodeDescriptor node = Node("first");
  absl::Status joined;
  Background join(
      [&] { joined = client_->Join(JoinRequestFor(config, node)).status(); });
  ASSERT_TRUE(Eventually([&] {
    auto job = GetJob("pair");
    return job.ok() && job->waiting_size() == 1;
  }, kSoon));
  EXPECT_TRUE(RawLeave("pair", node.incarnation_id()).ok());
  ASSERT_TRUE(join.Wait());
  EXPECT_EQ(joined.code(), absl::StatusCode::kCancelled) << joined;
  EXPECT_EQ(WaitingCount("pair"), 0);
  // Leaving twice: it is no longer waiting.
  EXPECT_EQ(RawLeave("pair", node.incarnation_id()).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------------------
// Bad input: KeyValue

TEST_F(CoordinatorTest, EveryKvMethodRejectsBadScopes) {
  ASSERT_TRUE(client_->CreateJob(Config("not-started", 2, 2)).ok());
  const v1::Assignment a = RunSingleNodeJob("running");
  ASSERT_EQ(a.round(), 1);
  struct Case {
    std::string name;
    v1::Scope scope;
    grpc::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"bad job id", ScopeOf("Bad_Job", 1), grpc::StatusCode::INVALID_ARGUMENT},
      {"empty job id", ScopeOf("", 1), grpc::StatusCode::INVALID_ARGUMENT},
      {"round 0", ScopeOf("running", 0), grpc::StatusCode::INVALID_ARGUMENT},
      {"negative round", ScopeOf("running", -3),
       grpc::StatusCode::INVALID_ARGUMENT},
      {"unknown job", ScopeOf("no-such-job", 1), grpc::StatusCode::NOT_FOUND},
      {"no round closed yet", ScopeOf("not-started", 1),
       grpc::StatusCode::FAILED_PRECONDITION},
      {"round not closed", ScopeOf("running", 2),
       grpc::StatusCode::FAILED_PRECONDITION},
  };
  for (const KvMethod& method : KvMethods()) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(method.name, ": ", c.name));
      grpc::Status status = method.call(c.scope, "key");
      EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    }
  }
  // None of the refused writes landed anywhere.
  auto listed = client_->List(ScopeOf(a), "", /*keys_only=*/true);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(*listed, IsEmpty());
}

TEST_F(CoordinatorTest, EveryKvMethodRejectsBadKeys) {
  const v1::Assignment a = RunSingleNodeJob("keys");
  const std::string too_long(1025, 'k');
  for (const KvMethod& method : KvMethods()) {
    SCOPED_TRACE(method.name);
    grpc::Status oversize = method.call(ScopeOf(a), too_long);
    EXPECT_EQ(oversize.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << oversize.error_message();
    if (method.name == "List") continue;  // an empty prefix lists everything
    grpc::Status empty = method.call(ScopeOf(a), "");
    EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << empty.error_message();
    EXPECT_THAT(empty.error_message(), HasSubstr("key must be 1-1024 bytes"));
  }
  // A 1024-byte key is fine.
  EXPECT_TRUE(client_->Set(ScopeOf(a), std::string(1024, 'k'), "v").ok());
  auto listed = client_->List(ScopeOf(a), "", /*keys_only=*/true);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].first, std::string(1024, 'k'));
}

TEST_F(CoordinatorTest, KvMethodSpecificErrors) {
  const v1::Assignment a = RunSingleNodeJob("kv-errors");
  const v1::Scope scope = ScopeOf(a);

  // Get of a missing key: NOT_FOUND. Delete of one: not an error.
  auto missing = client_->Get(scope, "missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto deleted = client_->Delete(scope, "missing");
  ASSERT_TRUE(deleted.ok());
  EXPECT_FALSE(*deleted);

  // Add on text: FAILED_PRECONDITION, value untouched; overflow: OUT_OF_RANGE.
  ASSERT_TRUE(client_->Set(scope, "text", "hello").ok());
  EXPECT_EQ(client_->Add(scope, "text", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*client_->Get(scope, "text"), "hello");
  ASSERT_TRUE(client_->Set(scope, "big", "9223372036854775807").ok());
  EXPECT_EQ(client_->Add(scope, "big", 1).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*client_->Get(scope, "big"), "9223372036854775807");

  // CompareAndSet with both expect_absent and expected: INVALID_ARGUMENT.
  v1::CompareAndSetRequest cas;
  *cas.mutable_scope() = scope;
  cas.set_key("cas");
  cas.set_expect_absent(true);
  cas.set_expected("x");
  cas.set_desired("y");
  EXPECT_EQ(client_->CompareAndSet(cas).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Get(scope, "cas").status().code(),
            absl::StatusCode::kNotFound);

  // Wait: no keys, negative timeout, beyond the maximum: INVALID_ARGUMENT.
  EXPECT_EQ(client_->Wait(scope, {}, absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status negative = client_->Wait(scope, {"k"}, absl::Milliseconds(-1));
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  EXPECT_THAT(negative.message(), HasSubstr("timeout"));
  EXPECT_EQ(
      client_->Wait(scope, {"k"}, absl::Hours(1) + absl::Seconds(1)).code(),
      absl::StatusCode::kInvalidArgument);

  // Wait for a key nobody sets: DEADLINE_EXCEEDED from the coordinator,
  // naming the missing key.
  ASSERT_TRUE(client_->Set(scope, "present", "1").ok());
  const absl::Time start = absl::Now();
  absl::Status timed_out =
      client_->Wait(scope, {"present", "absent"}, absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_THAT(timed_out.message(), HasSubstr("still missing: 'absent'"));
  EXPECT_GE(took, absl::Milliseconds(190));
  EXPECT_LT(took, kPromptly);
}

TEST_F(CoordinatorTest, ValuesOverOneMebibyteAreResourceExhausted) {
  const v1::Assignment a = RunSingleNodeJob("big-values");
  const v1::Scope scope = ScopeOf(a);
  const std::string too_big(kMiB + 1, 'x');

  absl::Status set = client_->Set(scope, "blob", too_big);
  EXPECT_EQ(set.code(), absl::StatusCode::kResourceExhausted) << set;
  EXPECT_EQ(client_->Get(scope, "blob").status().code(),
            absl::StatusCode::kNotFound);

  // An oversize write leaves the previous value in place.
  ASSERT_TRUE(client_->Set(scope, "kept", "old").ok());
  EXPECT_EQ(client_->Set(scope, "kept", too_big).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*client_->Get(scope, "kept"), "old");
  v1::CompareAndSetRequest cas;
  *cas.mutable_scope() = scope;
  cas.set_key("kept");
  cas.set_expected("old");
  cas.set_desired(too_big);
  EXPECT_EQ(client_->CompareAndSet(cas).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*client_->Get(scope, "kept"), "old");

  // Exactly 1 MiB is allowed and round-trips.
  const std::string largest(kMiB, 'y');
  ASSERT_TRUE(client_->Set(scope, "largest", largest).ok());
  auto read = client_->Get(scope, "largest");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), static_cast<size_t>(kMiB));
  EXPECT_EQ(*read, largest);
  auto listed = client_->List(scope, "", /*keys_only=*/true);
  ASSERT_TRUE(listed.ok());
  std::vector<std::string> keys;
  for (const auto& [key, value] : *listed) keys.push_back(key);
  EXPECT_THAT(keys, ElementsAreArray({"kept", "largest"}));
}

TEST_F(CoordinatorTest, KvWithAStaleRoundIsAbortedAfterAMemberRejoins) {
  const v1::JobConfig config = Config("rejoin", 2, 2);
  const v1::NodeDescriptor node_a = Node("a");
  const v1::NodeDescriptor node_b = Node("b");
  // Round 1 with two nodes.
  absl::StatusOr<v1::Assignment> a1, b1;
  {
    Background join_a(
        [&] { a1 = client_->Join(JoinRequestFor(config, node_a)); });
    Background join_b(
        [&] { b1 = client_->Join(JoinRequestFor(config, node_b)); });
    ASSERT_TRUE(join_a.Wait(absl::Seconds(30)));
    ASSERT_TRUE(join_b.Wait(absl::Seconds(30)));
  }
  ASSERT_TRUE(a1.ok()) << a1.status();
  ASSERT_TRUE(b1.ok()) << b1.status();
  ASSERT_EQ(a1->round(), 1);
  const v1::Scope round1 = ScopeOf(*a1);
  ASSERT_TRUE(client_->Set(round1, "round1-key", "v").ok());

  // B waits in round 1 for a key that never comes.
  absl::Status b_wait;
  Background waiting([&] {
    b_wait = NewClient()->Wait(round1, {"never"}, absl::Seconds(30));
  });

  // A rejoins (restarted, or told its round is over): round 1 is superseded
  // and A waits for round 2.
  absl::StatusOr<v1::Assignment> a2, b2;
  Background rejoin_a([&] {
    a2 = client_->Join(JoinRequestFor(config, node_a, /*last_round=*/1));
  });
  ASSERT_TRUE(Eventually([&] {
    auto job = GetJob("rejoin");
    return job.ok() && job->state() == v1::JOB_STATE_WAITING &&
           job->waiting_size() == 1;
  }, kSoon));
  // The pending wait of round 1 ends with ABORTED.
  ASSERT_TRUE(waiting.Wait());
  EXPECT_EQ(b_wait.code(), absl::StatusCode::kAborted) << b_wait;

  // Every KV call with round 1 is ABORTED now.
  for (const KvMethod& method : KvMethods()) {
    SCOPED_TRACE(method.name);
    grpc::Status status = method.call(round1, "key");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED)
        << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("rejoin"));
  }

  // B rejoins too: round 2 closes; round 1 stays ABORTED and its keys are
  // gone.
  Background rejoin_b([&] {
    b2 = client_->Join(JoinRequestFor(config, node_b, /*last_round=*/1));
  });
  ASSERT_TRUE(rejoin_a.Wait(absl::Seconds(30)));
  ASSERT_TRUE(rejoin_b.Wait(absl::Seconds(30)));
  ASSERT_TRUE(a2.ok()) << a2.status();
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(a2->round(), 2);
  EXPECT_EQ(b2->round(), 2);
  EXPECT_NE(a2->rank(), b2->rank());
  const v1::Scope round2 = ScopeOf(*a2);
  for (const KvMethod& method : KvMethods()) {
    SCOPED_TRACE(method.name);
    EXPECT_EQ(method.call(round1, "key").error_code(),
              grpc::StatusCode::ABORTED);
  }
  EXPECT_EQ(client_->Get(round2, "round1-key").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(client_->Set(round2, "round2-key", "v").ok());
}

TEST_F(CoordinatorTest, SingleNodeRejoinAbortsTheOldRoundImmediately) {
  v1::NodeDescriptor node;
  const v1::Assignment first = RunSingleNodeJob("restart", &node);
  ASSERT_EQ(first.round(), 1);
  // The same process rejoins after round 1: round 2 closes at once.
  auto second = client_->Join(
      JoinRequestFor(Config("restart", 1, 1), node, /*last_round=*/1));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->round(), 2);
  EXPECT_EQ(client_->Set(ScopeOf(first), "k", "v").code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(client_->Set(ScopeOf(*second), "k", "v").ok());
  // A retried join of round 1 (its answer lost) is not a rejoin: it gets
  // round 2's assignment back instead of superseding it.
  auto retried = client_->Join(
      JoinRequestFor(Config("restart", 1, 1), node, /*last_round=*/1));
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->round(), 2);
  EXPECT_TRUE(client_->Get(ScopeOf(*second), "k").ok());
}

// ---------------------------------------------------------------------------
// Bad input: Jobs

TEST_F(CoordinatorTest, CreateJobRejectsBadConfigsWithoutSideEffects) {
  ASSERT_TRUE(client_->CreateJob(Config("keeper", 1, 1)).ok());
  const std::string before = ListJobsSnapshot();

  struct Case {
    std::string name;
    v1::JobConfig config;
  };
  std::vector<Case> cases;
  auto add = [&](const std::string& name,
                 const std::function<void(v1::JobConfig*)>& edit) {
    v1::JobConfig config = Config("new-job", 1, 2);
    edit(&config);
    cases.push_back({name, config});
  };
  add("bad job id", [](v1::JobConfig* c) { c->set_job_id("New_Job"); });
  add("empty job id", [](v1::JobConfig* c) { c->clear_job_id(); });
  add("id ending in a dash", [](v1::JobConfig* c) { c->set_job_id("job-"); });
  add("min above max", [](v1::JobConfig* c) {
    c->set_min_nodes(3);
    c->set_max_nodes(2);
  });
  add("negative min", [](v1::JobConfig* c) { c->set_min_nodes(-1); });
  add("too many nodes", [](v1::JobConfig* c) { c->set_max_nodes(100001); });
  add("negative nproc", [](v1::JobConfig* c) { c->set_nproc_per_node(-1); });
  add("too many nproc", [](v1::JobConfig* c) { c->set_nproc_per_node(1025); });
  add("negative join timeout", [](v1::JobConfig* c) {
    *c->mutable_join_timeout() = ToProtoDuration(absl::Seconds(-5));
  });
  add("join timeout over a day", [](v1::JobConfig* c) {
    *c->mutable_join_timeout() = ToProtoDuration(absl::Hours(25));
  });
  add("negative last call", [](v1::JobConfig* c) {
    *c->mutable_last_call_timeout() = ToProtoDuration(absl::Seconds(-1));
  });
  add("unknown backend",
      [](v1::JobConfig* c) { c->set_backend(static_cast<v1::Backend>(42)); });
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    grpc::Status status = RawCreateJob(c.config);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
  }
  EXPECT_EQ(ListJobsSnapshot(), before);
}

TEST_F(CoordinatorTest, CreateJobTwiceIsAlreadyExists) {
  v1::CreateJobResponse created;
  ASSERT_TRUE(RawCreateJob(Config("twice", 1, 2), &created).ok());
  EXPECT_EQ(created.job().config().job_id(), "twice");
  EXPECT_EQ(created.job().state(), v1::JOB_STATE_WAITING);
  const std::string before = ListJobsSnapshot();

  grpc::Status same = RawCreateJob(Config("twice", 1, 2));
  EXPECT_EQ(same.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(same.error_message(), HasSubstr("already exists"));
  grpc::Status different = RawCreateJob(Config("twice", 3, 4));
  EXPECT_EQ(different.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  // The job keeps its first config.
  EXPECT_EQ(ListJobsSnapshot(), before);
  auto job = GetJob("twice");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->config().max_nodes(), 2);

  // A job created by a join exists as well.
  RunSingleNodeJob("joined");
  EXPECT_EQ(RawCreateJob(Config("joined", 1, 1)).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
}

TEST_F(CoordinatorTest, GetJobRejectsBadAndUnknownIds) {
  EXPECT_EQ(RawGetJob("Bad_Job").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RawGetJob("").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(RawGetJob(std::string(64, 'a')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status unknown = RawGetJob("no-such-job");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(), HasSubstr("no-such-job"));
}

TEST_F(CoordinatorTest, ListJobsIsSortedAndOmitsMembers) {
  auto empty = client_->ListJobs();
  ASSERT_TRUE(empty.ok());
  EXPECT_THAT(*empty, IsEmpty());
  ASSERT_TRUE(client_->CreateJob(Config("zeta", 1, 1)).ok());
  ASSERT_TRUE(client_->CreateJob(Config("alpha", 1, 1)).ok());
  RunSingleNodeJob("mid");
  auto jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::vector<std::string> ids;
  for (const v1::JobStatus& job : *jobs) {
    ids.push_back(job.config().job_id());
    EXPECT_THAT(job.members(), IsEmpty());
  }
  EXPECT_THAT(ids, ElementsAreArray({"alpha", "mid", "zeta"}));
  EXPECT_EQ((*jobs)[1].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*jobs)[1].world_size(), 1);
}

// ---------------------------------------------------------------------------
// Client cancellation

TEST_F(CoordinatorTest, JoinWhoseClientDeadlineExpiresIsWithdrawn) {
  const v1::JobConfig config = Config("impatient", 2, 2);
  ASSERT_TRUE(client_->CreateJob(config).ok());
  bool seen_waiting = false;
  absl::Status joined;
  Background join([&] {
    // The client gives up long before the coordinator's join timeout.
    joined = NewClient(/*max_attempts=*/1)
                 ->Join(JoinRequestFor(config, Node("early")), absl::Seconds(3))
                 .status();
  });
  // Seen waiting on the server while the call is in flight...
  seen_waiting = Eventually([&] { return WaitingCount("impatient") == 1; },
                            absl::Seconds(3));
  ASSERT_TRUE(join.Wait());
  EXPECT_TRUE(seen_waiting);
  EXPECT_EQ(joined.code(), absl::StatusCode::kDeadlineExceeded) << joined;
  // ...and withdrawn once the client's deadline passed.
  EXPECT_TRUE(
      Eventually([&] { return WaitingCount("impatient") == 0; }, kSoon));
  // The withdrawn process does not count: a later pair forms round 1
  // without it.
  absl::StatusOr<v1::Assignment> x, y;
  {
    Background jx(
        [&] { x = client_->Join(JoinRequestFor(config, Node("x"))); });
    Background jy(
        [&] { y = client_->Join(JoinRequestFor(config, Node("y"))); });
    ASSERT_TRUE(jx.Wait(absl::Seconds(30)));
    ASSERT_TRUE(jy.Wait(absl::Seconds(30)));
  }
  ASSERT_TRUE(x.ok()) << x.status();
  ASSERT_TRUE(y.ok()) << y.status();
  auto job = GetJob("impatient");
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->members_size(), 2);
  for (const v1::Member& m : job->members()) {
    EXPECT_NE(m.node().node_id(), "early");
  }
}

TEST_F(CoordinatorTest, JoinCancelledByTheClientIsWithdrawn) {
  const v1::JobConfig config = Config("cancelled", 2, 2);
  grpc::ClientContext context;
  grpc::Status status;
  Background join([&] {
    v1::JoinResponse response;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    status = rendezvous_->Join(&context, JoinRequestFor(config, Node("n")),
                               &response);
  });
  ASSERT_TRUE(Eventually([&] {
    auto job = GetJob("cancelled");
    return job.ok() && job->waiting_size() == 1;
  }, kSoon));
  context.TryCancel();
  ASSERT_TRUE(join.Wait());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(
      Eventually([&] { return WaitingCount("cancelled") == 0; }, kSoon));
}

TEST_F(CoordinatorTest, NodeJoinsFormARoundWithOneCallPerNode) {
  v1::JobConfig config = Config("nodes", 2, 2);
  config.set_nproc_per_node(3);
  absl::StatusOr<std::vector<v1::Assignment>> a, b;
  {
    Background ja([&] {
      a = client_->JoinNode(JoinNodeRequestFor(config, "node-a", 3));
    });
    Background jb([&] {
      b = client_->JoinNode(JoinNodeRequestFor(config, "node-b", 3));
    });
    ASSERT_TRUE(ja.Wait(absl::Seconds(30)));
    ASSERT_TRUE(jb.Wait(absl::Seconds(30)));
  }
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  std::set<int> ranks;
  for (const auto* node : {&*a, &*b}) {
    ASSERT_EQ(node->size(), 3u);
    for (int local = 0; local < 3; ++local) {
      EXPECT_EQ((*node)[local].local_rank(), local);
      EXPECT_EQ((*node)[local].world_size(), 6);
      ranks.insert((*node)[local].rank());
    }
  }
  EXPECT_EQ(ranks.size(), 6u);
  auto job = GetJob("nodes");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->members_size(), 6);
}

TEST_F(CoordinatorTest, NodeJoinCancelledByTheClientWithdrawsEveryProcess) {
  v1::JobConfig config = Config("node-cancelled", 2, 2);
  config.set_nproc_per_node(2);
  grpc::ClientContext context;
  grpc::Status status;
  Background join([&] {
    v1::JoinNodeResponse response;
    status = rendezvous_->JoinNode(
        &context, JoinNodeRequestFor(config, "node-a", 2), &response);
  });
  ASSERT_TRUE(Eventually([&] {
    auto job = GetJob("node-cancelled");
    return job.ok() && job->waiting_size() == 2;
  }, kSoon));
  context.TryCancel();
  ASSERT_TRUE(join.Wait());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(
      Eventually([&] { return WaitingCount("node-cancelled") == 0; }, kSoon));
}

TEST_F(CoordinatorTest, BadNodeJoinIsInvalidArgument) {
  v1::JobConfig config = Config("node-bad", 1, 1);
  config.set_nproc_per_node(2);
  v1::JoinNodeRequest request = JoinNodeRequestFor(config, "node-a", 3);
  v1::JoinNodeResponse response;
  grpc::Status status = RawCall(rendezvous_.get(),
                                &v1::Rendezvous::Stub::JoinNode, request,
                                &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("runs 2 per node"));
  EXPECT_EQ(GetJob("node-bad").status().code(), absl::StatusCode::kNotFound);
}

// A one-node job of `n` processes, joined with one call.
std::vector<v1::Assignment> JoinOneNodeJob(CoordinatorClient* client,
                                           const std::string& job_id, int n) {
  v1::JobConfig config = Config(job_id, 1, 1);
  config.set_nproc_per_node(n);
  absl::StatusOr<std::vector<v1::Assignment>> a =
      client->JoinNode(JoinNodeRequestFor(config, job_id + "-node", n));
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *a : std::vector<v1::Assignment>();
}

std::vector<int> Ranks(const v1::JobStatus& job) {
  std::vector<int> ranks;
  for (const v1::Member& m : job.members()) ranks.push_back(m.rank());
  return ranks;
}

TEST_F(CoordinatorTest, GetJobAnswersASummaryARangeOrPages) {
  ASSERT_EQ(JoinOneNodeJob(client_.get(), "paged", 5).size(), 5u);
  v1::GetJobRequest request;
  request.set_job_id("paged");
  request.mutable_members()->set_none(true);
  absl::StatusOr<v1::GetJobResponse> summary = client_->QueryJob(request);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->job().members_size(), 0);
  EXPECT_EQ(summary->job().world_size(), 5);
  EXPECT_EQ(summary->job().summary().active(), 5);
  EXPECT_EQ(summary->job().summary().lost(), 0);

  request.clear_members();
  request.mutable_members()->set_rank_from(1);
  request.mutable_members()->set_rank_to(4);
  absl::StatusOr<v1::GetJobResponse> range = client_->QueryJob(request);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_THAT(Ranks(range->job()), ::testing::ElementsAre(1, 2, 3));
  EXPECT_EQ(range->job().summary().matching(), 3);
  EXPECT_EQ(range->next_page_token(), "");

  request.clear_members();
  request.mutable_members()->set_page_size(2);
  std::vector<std::vector<int>> pages;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<v1::GetJobResponse> page = client_->QueryJob(request);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ(page->job().summary().matching(), 5);
    pages.push_back(Ranks(page->job()));
    if (page->next_page_token().empty()) break;
    request.mutable_members()->set_page_token(page->next_page_token());
  }
  EXPECT_THAT(pages, ::testing::ElementsAre(::testing::ElementsAre(0, 1),
                                            ::testing::ElementsAre(2, 3),
                                            ::testing::ElementsAre(4)));
  // The default is every member, as before queries existed.
  absl::StatusOr<v1::JobStatus> all = client_->GetJob("paged");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->members_size(), 5);
}

TEST_F(CoordinatorTest, BadMemberQueriesAreInvalidArgument) {
  ASSERT_EQ(JoinOneNodeJob(client_.get(), "bad-query", 2).size(), 2u);
  struct Case {
    std::function<void(v1::MemberQuery*)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::MemberQuery* q) { q->set_rank_from(-1); }, "rank range"},
      {[](v1::MemberQuery* q) {
         q->set_rank_from(3);
         q->set_rank_to(3);
       },
       "rank range [3, 3)"},
      {[](v1::MemberQuery* q) { q->set_page_size(-2); }, "page_size"},
      {[](v1::MemberQuery* q) { q->set_page_token("next"); }, "page_token"},
      {[](v1::MemberQuery* q) {
         q->set_rank_to(2);
         q->set_page_token("7");
       },
       "does not continue this query"},
  };
  for (const Case& c : cases) {
    v1::GetJobRequest request;
    request.set_job_id("bad-query");
    c.set(request.mutable_members());
    absl::StatusOr<v1::GetJobResponse> answer = client_->QueryJob(request);
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    EXPECT_THAT(answer.status().message(), HasSubstr(c.message));
  }
  v1::MemberQuery paged;
  paged.set_page_size(1);
  absl::Status watched = client_->WatchJob(
      "bad-query", absl::Milliseconds(100), false,
      [](const v1::JobStatus&) { return true; }, paged);
  EXPECT_EQ(watched.code(), absl::StatusCode::kInvalidArgument) << watched;
}

TEST_F(CoordinatorTest, KvWaitWhoseClientDeadlineExpiresIsWithdrawn) {
  const v1::Assignment a = RunSingleNodeJob("kv-deadline");
  v1::WaitRequest request;
  *request.mutable_scope() = ScopeOf(a);
  request.add_keys("never");
  request.set_timeout_ms(0);  // the coordinator would wait an hour
  v1::WaitResponse response;
  const absl::Time start = absl::Now();
  grpc::Status status = RawCall(kv_.get(), &v1::KeyValue::Stub::Wait, request,
                                &response, absl::Milliseconds(300));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, kPromptly);
  // The store still works. (Not by setting "never": that would complete a
  // wait the server failed to withdraw and hide the leak checked below.)
  EXPECT_TRUE(client_->Set(ScopeOf(a), "other", "value").ok());
  // No call is left in flight on the server: Shutdown is prompt even with a
  // long grace.
  ExpectPromptShutdown();
}

TEST_F(CoordinatorTest, KvWaitCancelledByTheClientIsWithdrawn) {
  const v1::Assignment a = RunSingleNodeJob("kv-cancel");
  v1::WaitRequest request;
  *request.mutable_scope() = ScopeOf(a);
  request.add_keys("never");
  request.set_timeout_ms(0);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::WaitResponse response;
  grpc::Status status;
  absl::Notification done;
  kv_->async()->Wait(&context, &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  // A later call on the same channel has been answered, so the wait most
  // likely reached the server first; however far it got, a cancel must end
  // it on both sides.
  v1::SetRequest set;
  *set.mutable_scope() = ScopeOf(a);
  set.set_key("other");
  v1::SetResponse set_response;
  ASSERT_TRUE(
      RawCall(kv_.get(), &v1::KeyValue::Stub::Set, set, &set_response).ok());
  EXPECT_FALSE(done.HasBeenNotified());
  context.TryCancel();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kPromptly));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  // No call is left in flight on the server.
  ExpectPromptShutdown();
}

// ---------------------------------------------------------------------------
// Health

// grpc.health.v1.Health/Check through a generic stub: the request is a
// HealthCheckRequest{service}, the answer HealthCheckResponse{status} whose
// only field is varint field 1 (SERVING = 1, so 0x08 0x01).
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& service, std::string* answer) {
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);  // field 1, length-delimited
    request.push_back(static_cast<char>(service.size()));  // < 128
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request_buffer, &response_buffer, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  answer->clear();
  if (status.ok()) {
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(response_buffer.Dump(&slices).ok());
    for (const grpc::Slice& s : slices) {
      answer->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

TEST_F(CoordinatorTest, HealthCheckReportsServing) {
  std::string answer;
  grpc::Status status = HealthCheck(channel_, "", &answer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(answer, std::string("\x08\x01", 2));
  // An unknown service name is NOT_FOUND.
  status = HealthCheck(channel_, "no.such.Service", &answer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------------------
// Retries

TEST_F(CoordinatorTest, ClientReachesACoordinatorThatStartsLater) {
  const int port = PickUnusedPort();
  const std::string target = absl::StrCat("127.0.0.1:", port);
  ClientOptions options = Options(target);
  options.retry.initial_backoff = absl::Milliseconds(20);
  options.retry.max_backoff = absl::Milliseconds(200);
  auto created = GrpcCoordinatorClient::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<CoordinatorClient> client = std::move(*created);

  // Nothing listens yet: a call that does not wait fails UNAVAILABLE.
  {
    auto probe_channel =
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    auto probe = v1::Jobs::NewStub(probe_channel);
    v1::ListJobsResponse response;
    EXPECT_EQ(RawCall(probe.get(), &v1::Jobs::Stub::ListJobs,
                      v1::ListJobsRequest(), &response)
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }

  absl::Notification started;
  absl::StatusOr<v1::Assignment> joined;
  absl::StatusOr<std::vector<v1::JobStatus>> listed;
  Background join([&] {
    started.Notify();
    joined = client->Join(JoinRequestFor(Config("late", 1, 1), Node("n")),
                          absl::Seconds(30));
  });
  // ListJobs fails fast while nothing listens, so this one exercises the
  // client's retry loop rather than wait-for-ready.
  Background list([&] { listed = client->ListJobs(); });
  started.WaitForNotification();
  // The first attempts fail: the port is still closed.
  {
    auto probe_channel =
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    auto probe = v1::Jobs::NewStub(probe_channel);
    v1::ListJobsResponse response;
    EXPECT_EQ(RawCall(probe.get(), &v1::Jobs::Stub::ListJobs,
                      v1::ListJobsRequest(), &response)
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_FALSE(join.done());

  std::unique_ptr<Coordinator> late = StartCoordinator(target, kLongGrace);
  ASSERT_NE(late, nullptr);
  ASSERT_EQ(late->port(), port);
  ASSERT_TRUE(join.Wait(absl::Seconds(15)));
  ASSERT_TRUE(list.Wait(absl::Seconds(15)));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->job_id(), "late");
  EXPECT_EQ(joined->round(), 1);
  EXPECT_EQ(joined->world_size(), 1);
  EXPECT_TRUE(listed.ok()) << listed.status();
  auto job = client->GetJob("late");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  const absl::Time start = absl::Now();
  late->Shutdown();
  EXPECT_LT(absl::Now() - start, kPromptly);
}

TEST_F(CoordinatorTest, ClientGivesUpOnAnAbsentCoordinatorWithinItsBudget) {
  ClientOptions options = Options(absl::StrCat("127.0.0.1:", PickUnusedPort()));
  options.retry.max_attempts = 4;
  options.retry.initial_backoff = absl::Milliseconds(10);
  auto client = GrpcCoordinatorClient::Create(options);
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  auto jobs = (*client)->ListJobs();
  EXPECT_LT(absl::Now() - start, kPromptly);
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(jobs.status().message(), HasSubstr("cannot reach"));
  EXPECT_THAT(jobs.status().message(), HasSubstr("4 attempt(s)"));
}

// ---------------------------------------------------------------------------
// Graceful shutdown

TEST_F(CoordinatorTest, ShutdownWithAPendingJoinEndsItPromptly) {
  const absl::Duration grace = absl::Milliseconds(300);
  std::unique_ptr<Coordinator> coordinator =
      StartCoordinator("127.0.0.1:0", grace);
  ASSERT_NE(coordinator, nullptr);
  ClientOptions options =
      Options(absl::StrCat("127.0.0.1:", coordinator->port()));
  options.retry.max_attempts = 1;  // report the first failure
  auto client = GrpcCoordinatorClient::Create(options);
  ASSERT_TRUE(client.ok());

  absl::Status joined;
  Background join([&] {
    joined = (*client)
                 ->Join(JoinRequestFor(Config("pending", 2, 2), Node("n")))
                 .status();
  });
  ASSERT_TRUE(Eventually([&] {
    auto job = (*client)->GetJob("pending");
    return job.ok() && job->waiting_size() == 1;
  }, kSoon));

  const absl::Time start = absl::Now();
  coordinator->Shutdown();
  const absl::Duration took = absl::Now() - start;
  // The pending join had the grace to finish, then was cancelled.
  EXPECT_GE(took, grace - absl::Milliseconds(50));
  EXPECT_LT(took, kPromptly);
  ASSERT_TRUE(join.Wait());
  EXPECT_THAT(joined.code(), AnyOf(absl::StatusCode::kUnavailable,
                                   absl::StatusCode::kCancelled))
      << joined;
  coordinator->Shutdown();  // idempotent
  coordinator->Wait();      // returns: shutdown has completed
}

// Request records a coordinator before ForgetJob deleted them left behind
// when it forgot a job: deleted when the next coordinator starts on that
// storage, before a job of that id could find them; a live job's stay.
TEST(CoordinatorRestoreTest, StartDeletesTheKeyValueRecordsOfForgottenJobs) {
  InMemoryStorage storage;
  ASSERT_TRUE(storage.Put("kvreq/gone/2/r1", "add 1 n").ok());
  {
    CoordinatorConfig config;
    config.storage = &storage;
    config.listen_address = "127.0.0.1:0";
    Coordinator coordinator(config);
    ASSERT_TRUE(coordinator.Start().ok());
    coordinator.Shutdown();
  }
  EXPECT_THAT(storage.Scan("kvreq/", /*keys_only=*/true).value(), IsEmpty());
}

}  // namespace
}  // namespace gradsync
