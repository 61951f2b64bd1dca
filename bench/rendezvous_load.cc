// Rendezvous load generator: N simulated workers join one job over gRPC.
//
// Reports the time until every worker has its rank (first request sent to
// last assignment received), join latency percentiles, and key-value RPC
// latency percentiles (Set then Get, a bounded number in flight). Each
// assignment is checked: ranks must be exactly 0..N-1 (#wrong counts
// violations), so speed is never reported without correctness.
//
//   bazel run -c opt //bench:rendezvous_load -- --workers=10000
//
// The simulated workers send their joins from a lean HTTP/2 client
// (bench/h2_unary_client.h: the same requests on the wire for a fraction of
// the CPU, which matters when they share 2 cores with the coordinator), or
// with --join_client=grpc from gRPC's C++ client; the key-value calls always
// use gRPC's client.
//
// By default an in-process coordinator on 127.0.0.1 serves the load, from
// memory or, with --state_dir=DIR, from durable SQLite state; with
// --coordinator=HOST:PORT an external one (loopback only) does.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/process_usage.h"
#include "proto/gradsync/v1/health.grpc.pb.h"
#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "proto/gradsync/v1/kv.grpc.pb.h"
#include "proto/gradsync/v1/rendezvous.grpc.pb.h"
#include "server/coordinator.h"
#include "server/server_credentials.h"
#include "server/storage/open_storage.h"
#include "bench/h2_unary_client.h"
#include "common/channel_credentials.h"

ABSL_FLAG(int, workers, 10000, "simulated workers (ranks) joining one job");
ABSL_FLAG(int, nproc_per_node, 1,
          "ranks per node: above 1, each node joins all its ranks in one "
          "Rendezvous.JoinNode call, as gradsync launch does");
ABSL_FLAG(int, coordinator_pid, 0,
          "with --coordinator: its process id, to report its memory");
ABSL_FLAG(int, channels, 8,
          "client connections the workers share; 0 gives every worker its "
          "own connection, opened inside the timed region (as real workers, "
          "and TCPStore clients, do)");
ABSL_FLAG(std::string, join_client, "h2",
          "with --channels above 0, how the simulated workers send their "
          "joins: h2 (the same HTTP/2 requests from a lean client, see "
          "bench/h2_unary_client.h) or grpc (gRPC's C++ client, which costs "
          "this process about as much CPU as the coordinator it measures)");
ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of a running coordinator (default: start one in-process "
          "on 127.0.0.1)");
ABSL_FLAG(int, kv_ops, 20000, "key-value Set+Get pairs to time");
ABSL_FLAG(bool, completions, false,
          "after the key-value load, every worker reports its success "
          "(Monitor.ReportCompletion): the time until the job SUCCEEDED");
ABSL_FLAG(int, completions_in_flight, 1000,
          "with --completions, completion reports in flight at once");
ABSL_FLAG(int, kv_in_flight, 64, "key-value calls in flight at once");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(120),
          "give up when the load has not finished within this time");
ABSL_FLAG(std::string, job, "bench", "job id to use");
ABSL_FLAG(std::string, state_dir, "",
          "in-process coordinator only: keep state in a SQLite database in "
          "this (fresh) directory, as gradsync-coordinator --state_dir does");
ABSL_FLAG(std::string, etcd, "",
          "with the in-process coordinator: keep its state in the etcd at "
          "HOST:PORT, as gradsync-coordinator --etcd does");
ABSL_FLAG(std::string, tls_cert, "",
          "in-process coordinator: serve over TLS with this PEM certificate "
          "(and --tls_key); the clients then trust --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "the PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA the clients trust (TLS)");
ABSL_FLAG(bool, tokens, false,
          "the in-process coordinator checks per-job tokens (--auth=token): "
          "an admin creates the job (Jobs.CreateJob) and every join and "
          "key-value call carries the job's token");
ABSL_FLAG(std::string, etcd_prefix, "/gradsync-bench/",
          "namespace of the state in --etcd (use a fresh one per run)");

namespace gradsync {
namespace {

struct Percentiles {
  absl::Duration p50, p90, p99, max;
};

Percentiles Summarize(std::vector<absl::Duration> samples) {
  Percentiles p;
  if (samples.empty()) return p;
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    size_t i = static_cast<size_t>(q * (samples.size() - 1));
    return samples[i];
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  p.max = samples.back();
  return p;
}

std::string Ms(absl::Duration d) {
  return absl::StrFormat("%.3f", absl::ToDoubleMilliseconds(d));
}

void PrintRow(const char* what, size_t n, const Percentiles& p) {
  std::printf("%-10s %8zu %10s %10s %10s %10s\n", what, n, Ms(p.p50).c_str(),
              Ms(p.p90).c_str(), Ms(p.p99).c_str(), Ms(p.max).c_str());
}

// The admin token of the in-process coordinator under --tokens.
constexpr char kAdminToken[] = "gradsync-bench-admin-token";

// The job's token (--tokens), set once in Main(); empty: none.
std::string& JobToken() {
  static auto* token = new std::string;
  return *token;
}

// Sends the job's token with the call, as gradsync's clients do.
void Authorize(grpc::ClientContext* context) {
  if (!JobToken().empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", JobToken()));
  }
}

// The clients' transport security (--tls_ca), set once in Main().
std::shared_ptr<grpc::ChannelCredentials>& ClientCredentials() {
  static auto* credentials = new std::shared_ptr<grpc::ChannelCredentials>(
      grpc::InsecureChannelCredentials());
  return *credentials;
}

std::vector<std::shared_ptr<grpc::Channel>> Connect(const std::string& target,
                                                    int count,
                                                    bool wait_connected) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args;
    // A distinct argument and a local subchannel pool give each channel its
    // own TCP connection.
    args.SetInt("gradsync.bench_channel", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel =
        grpc::CreateCustomChannel(target, ClientCredentials(), args);
    if (wait_connected) {
      channel->WaitForConnected(std::chrono::system_clock::now() +
                                std::chrono::seconds(10));
    }
    channels.push_back(std::move(channel));
  }
  return channels;
}

// One simulated node's join: of one process (Join), or of all the
// processes of a node (JoinNode).
struct JoinCall {
  grpc::ClientContext context;
  v1::JoinRequest request;
  v1::JoinResponse response;
  v1::JoinNodeRequest node_request;
  v1::JoinNodeResponse node_response;
  absl::Time sent;
  absl::Time received;
  grpc::Status status;
};

v1::NodeDescriptor SimulatedProcess(int node, int local) {
  v1::NodeDescriptor d;
  d.set_node_id(absl::StrCat("sim-node-", node));
  d.set_hostname(absl::StrCat("sim-host-", node));
  d.set_pid(100000 + local);
  d.set_incarnation_id(absl::StrCat("sim-", node, "-", local));
  d.set_device_type(v1::DEVICE_TYPE_CPU);
  d.set_device_count(1);
  d.add_addresses("127.0.0.1");
  return d;
}

struct JoinResult {
  absl::Duration all_ranked;
  int calls = 0;  // join calls: one per node
  std::vector<absl::Duration> latencies;
  int wrong = 0;
  int failed = 0;
  std::string first_error;
  // Every ranked process, as it names itself in reports.
  std::vector<v1::MemberRef> members;
};

// The job the simulated workers join: `workers` ranks as nodes of `nproc`.
v1::JobConfig BenchJobConfig(int workers, int nproc, absl::Duration timeout) {
  v1::JobConfig config;
  config.set_job_id(absl::GetFlag(FLAGS_job));
  config.set_min_nodes(workers / nproc);
  config.set_max_nodes(workers / nproc);
  config.set_nproc_per_node(nproc);
  *config.mutable_join_timeout() = ToProtoDuration(timeout);
  if (absl::GetFlag(FLAGS_completions)) {
    // The simulated workers never heartbeat: a minute's interval keeps
    // them from being found lost while they report their completions.
    *config.mutable_heartbeat_interval() = ToProtoDuration(absl::Minutes(1));
  }
  return config;
}

// --tokens: the admin creates the job and its token becomes JobToken().
bool CreateJobWithToken(const std::string& target, const std::string& admin,
                        const v1::JobConfig& config) {
  auto stub = v1::Jobs::NewStub(Connect(target, 1, true).front());
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", admin));
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CreateJobRequest request;
  *request.mutable_config() = config;
  v1::CreateJobResponse response;
  grpc::Status status = stub->CreateJob(&context, request, &response);
  if (!status.ok() || response.token().empty()) {
    std::fprintf(stderr, "cannot create the job with a token: %s\n",
                 status.error_message().c_str());
    return false;
  }
  JobToken() = response.token();
  return true;
}

// The join calls of `workers` simulated processes, `nproc` to a node.
std::vector<std::unique_ptr<JoinCall>> MakeJoinCalls(int workers, int nproc,
                                                     absl::Duration timeout) {
  const int nodes = workers / nproc;
  const v1::JobConfig config = BenchJobConfig(workers, nproc, timeout);
  std::vector<std::unique_ptr<JoinCall>> calls(nodes);
  for (int i = 0; i < nodes; ++i) {
    auto call = std::make_unique<JoinCall>();
    if (nproc == 1) {
      call->request.set_job_id(config.job_id());
      *call->request.mutable_config() = config;
      *call->request.mutable_node() = SimulatedProcess(i, 0);
    } else {
      call->node_request.set_job_id(config.job_id());
      *call->node_request.mutable_config() = config;
      for (int local = 0; local < nproc; ++local) {
        *call->node_request.add_processes()->mutable_node() =
            SimulatedProcess(i, local);
      }
    }
    calls[i] = std::move(call);
  }
  return calls;
}

// Sends `calls` with gRPC's C++ client (its callback API) and waits for
// their answers. The joins carry no gRPC deadline, as gradsync-worker's do
// not (its client keeps the deadline and cancels): the coordinator keeps no
// timer per waiting join. False when the answers did not come within
// `timeout` (and a few seconds).
bool SendJoinsWithGrpc(
    const std::string& target,
    const std::vector<std::shared_ptr<grpc::Channel>>& shared_channels,
    int nproc, absl::Duration timeout,
    std::vector<std::unique_ptr<JoinCall>>* calls, absl::Time* start) {
  std::atomic<int> outstanding{static_cast<int>(calls->size())};
  absl::Notification all_done;
  *start = absl::Now();
  std::vector<std::shared_ptr<grpc::Channel>> channels =
      shared_channels.empty() ? Connect(target, calls->size(), false)
                              : shared_channels;
  std::vector<std::unique_ptr<v1::Rendezvous::Stub>> stubs;
  for (const auto& channel : channels) {
    stubs.push_back(v1::Rendezvous::NewStub(channel));
  }
  for (size_t i = 0; i < calls->size(); ++i) {
    JoinCall* call = (*calls)[i].get();
    auto done = [call, &outstanding, &all_done](grpc::Status status) {
      call->received = absl::Now();
      call->status = std::move(status);
      if (outstanding.fetch_sub(1) == 1) all_done.Notify();
    };
    Authorize(&call->context);
    call->sent = absl::Now();
    v1::Rendezvous::Stub* stub = stubs[i % stubs.size()].get();
    if (nproc == 1) {
      stub->async()->Join(&call->context, &call->request, &call->response,
                          std::move(done));
    } else {
      stub->async()->JoinNode(&call->context, &call->node_request,
                              &call->node_response, std::move(done));
    }
  }
  if (!all_done.WaitForNotificationWithTimeout(timeout + absl::Seconds(5))) {
    for (auto& call : *calls) call->context.TryCancel();
    all_done.WaitForNotification();
    return false;
  }
  return true;
}

// Sends `calls` as the same HTTP/2 requests from the lean client, on its
// connections, and waits for their answers; false when they did not come
// within `timeout`.
bool SendJoinsWithH2(H2UnaryClient* client, int nproc, absl::Duration timeout,
                     std::vector<std::unique_ptr<JoinCall>>* calls,
                     absl::Time* start) {
  std::vector<H2UnaryClient::Call> h2_calls(calls->size());
  for (size_t i = 0; i < calls->size(); ++i) {
    const JoinCall& call = *(*calls)[i];
    H2UnaryClient::Call& h2 = h2_calls[i];
    h2.path = nproc == 1 ? "/gradsync.v1.Rendezvous/Join"
                         : "/gradsync.v1.Rendezvous/JoinNode";
    h2.request = nproc == 1 ? call.request.SerializeAsString()
                            : call.node_request.SerializeAsString();
    if (!JobToken().empty()) {
      h2.metadata.emplace_back("authorization",
                               absl::StrCat("Bearer ", JobToken()));
    }
  }
  *start = absl::Now();
  absl::Status ran = client->Run(&h2_calls, timeout + absl::Seconds(5));
  if (absl::IsDeadlineExceeded(ran)) return false;
  for (size_t i = 0; i < calls->size(); ++i) {
    JoinCall& call = *(*calls)[i];
    const H2UnaryClient::Call& h2 = h2_calls[i];
    call.sent = h2.sent;
    call.received = h2.received;
    call.status =
        h2.code < 0
            ? grpc::Status(grpc::StatusCode::UNKNOWN,
                           absl::StrCat("no answer: ", ran.ToString()))
            : grpc::Status(static_cast<grpc::StatusCode>(h2.code), h2.message);
    const bool parsed = nproc == 1 ? call.response.ParseFromString(h2.response)
                                   : call.node_response.ParseFromString(
                                         h2.response);
    if (call.status.ok() && !parsed) {
      call.status = grpc::Status(grpc::StatusCode::INTERNAL,
                                 "the answer does not parse");
    }
  }
  return true;
}

// Joins `workers` simulated processes, `nproc` to a node, over the lean
// client when `h2` is set, else over `shared_channels` (or a new
// connection each when empty), and checks every assignment.
bool RunJoins(const std::string& target,
              const std::vector<std::shared_ptr<grpc::Channel>>& shared_channels,
              H2UnaryClient* h2, int workers, int nproc,
              absl::Duration timeout, JoinResult* result) {
  std::vector<std::unique_ptr<JoinCall>> calls =
      MakeJoinCalls(workers, nproc, timeout);
  absl::Time start;
  const bool answered =
      h2 != nullptr
          ? SendJoinsWithH2(h2, nproc, timeout, &calls, &start)
          : SendJoinsWithGrpc(target, shared_channels, nproc, timeout, &calls,
                              &start);
  if (!answered) return false;
  absl::Time last = start;
  std::vector<int> rank_seen(workers, 0);
  auto check = [&](const v1::Assignment& a, const v1::NodeDescriptor& node) {
    if (a.rank() < 0 || a.rank() >= workers || a.world_size() != workers ||
        rank_seen[a.rank()]++ > 0) {
      ++result->wrong;
    }
    v1::MemberRef& member = result->members.emplace_back();
    member.set_job_id(a.job_id());
    member.set_round(a.round());
    member.set_rank(a.rank());
    member.set_incarnation_id(node.incarnation_id());
  };
  for (const auto& call : calls) {
    if (!call->status.ok()) {
      if (result->failed++ == 0) result->first_error = call->status.error_message();
      continue;
    }
    last = std::max(last, call->received);
    result->latencies.push_back(call->received - call->sent);
    if (nproc == 1) {
      check(call->response.assignment(), call->request.node());
    } else if (call->node_response.assignments_size() != nproc) {
      ++result->wrong;
    } else {
      for (int k = 0; k < nproc; ++k) {
        check(call->node_response.assignments(k),
              call->node_request.processes(k).node());
      }
    }
  }
  result->calls = calls.size();
  result->all_ranked = last - start;
  return true;
}

// Set then Get of distinct keys with a bounded number of calls in flight.
struct KvResult {
  std::vector<absl::Duration> set_latencies, get_latencies;
  int wrong = 0;
  int failed = 0;
  absl::Duration elapsed;
};

class KvLoad {
 public:
  KvLoad(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
         v1::Scope scope, int ops, int in_flight)
      : scope_(std::move(scope)), ops_(ops), in_flight_(in_flight) {
    for (const auto& channel : channels) {
      stubs_.push_back(v1::KeyValue::NewStub(channel));
    }
  }

  KvResult Run() {
    const absl::Time start = absl::Now();
    for (int i = 0; i < std::min(in_flight_, ops_); ++i) StartSet(NextOp());
    done_.WaitForNotification();
    result_.elapsed = absl::Now() - start;
    return std::move(result_);
  }

 private:
  int NextOp() {
    absl::MutexLock lock(&mu_);
    return next_op_ < ops_ ? next_op_++ : -1;
  }

  void StartSet(int op) {
    if (op < 0) return;
    auto* call = new SetCall();
    call->request.mutable_scope()->CopyFrom(scope_);
    call->request.set_key(absl::StrCat("key/", op));
    call->request.set_value(absl::StrCat("value-", op));
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::seconds(30));
    Authorize(&call->context);
    call->sent = absl::Now();
    stubs_[op % stubs_.size()]->async()->Set(
        &call->context, &call->request, &call->response,
        [this, call, op](grpc::Status status) {
          absl::Duration latency = absl::Now() - call->sent;
          delete call;
          Record(&result_.set_latencies, latency, status.ok());
          if (status.ok()) {
            StartGet(op);
          } else {
            Finish();
          }
        });
  }

  void StartGet(int op) {
    auto* call = new GetCall();
    call->request.mutable_scope()->CopyFrom(scope_);
    call->request.set_key(absl::StrCat("key/", op));
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::seconds(30));
    Authorize(&call->context);
    call->sent = absl::Now();
    stubs_[op % stubs_.size()]->async()->Get(
        &call->context, &call->request, &call->response,
        [this, call, op](grpc::Status status) {
          absl::Duration latency = absl::Now() - call->sent;
          bool right = status.ok() &&
                       call->response.value() == absl::StrCat("value-", op);
          delete call;
          Record(&result_.get_latencies, latency, status.ok());
          if (status.ok() && !right) {
            absl::MutexLock lock(&mu_);
            ++result_.wrong;
          }
          Finish();
        });
  }

  void Record(std::vector<absl::Duration>* latencies, absl::Duration latency,
              bool ok) {
    absl::MutexLock lock(&mu_);
    latencies->push_back(latency);
    if (!ok) ++result_.failed;
  }

  // One Set+Get pair is over: finish the run after the last, else start the
  // next pair (if any is left to start).
  void Finish() {
    {
      absl::MutexLock lock(&mu_);
      if (++finished_ == ops_) {
        done_.Notify();
        return;
      }
    }
    StartSet(NextOp());
  }

  struct SetCall {
    grpc::ClientContext context;
    v1::SetRequest request;
    v1::SetResponse response;
    absl::Time sent;
  };
  struct GetCall {
    grpc::ClientContext context;
    v1::GetRequest request;
    v1::GetResponse response;
    absl::Time sent;
  };

  const v1::Scope scope_;
  const int ops_;
  const int in_flight_;
  std::vector<std::unique_ptr<v1::KeyValue::Stub>> stubs_;
  absl::Mutex mu_;
  int next_op_ ABSL_GUARDED_BY(mu_) = 0;
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  KvResult result_;
  absl::Notification done_;
};

// Every member reports its success, with a bounded number of reports in
// flight; the time from the first sent to the last answered.
struct CompletionResult {
  std::vector<absl::Duration> latencies;
  int failed = 0;
  std::string first_error;
  absl::Duration elapsed;
};

CompletionResult RunCompletions(
    const std::vector<std::shared_ptr<grpc::Channel>>& channels,
    const std::vector<v1::MemberRef>& members, int in_flight) {
  struct Call {
    grpc::ClientContext context;
    v1::ReportCompletionRequest request;
    v1::ReportCompletionResponse response;
    absl::Time sent;
  };
  std::vector<std::unique_ptr<v1::Monitor::Stub>> stubs;
  for (const auto& channel : channels) stubs.push_back(v1::Monitor::NewStub(channel));
  CompletionResult result;
  absl::Mutex mu;
  size_t next = 0, answered = 0;
  absl::Notification all_done;
  std::function<void()> start_next = [&] {
    size_t i;
    {
      absl::MutexLock lock(&mu);
      if (next >= members.size()) return;
      i = next++;
    }
    auto* call = new Call();
    *call->request.mutable_member() = members[i];
    call->request.set_success(true);
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::seconds(120));
    Authorize(&call->context);
    call->sent = absl::Now();
    stubs[i % stubs.size()]->async()->ReportCompletion(
        &call->context, &call->request, &call->response,
        [&, call](grpc::Status status) {
          const absl::Duration latency = absl::Now() - call->sent;
          delete call;
          bool last;
          {
            absl::MutexLock lock(&mu);
            result.latencies.push_back(latency);
            if (!status.ok() && result.failed++ == 0) {
              result.first_error = status.error_message();
            }
            last = ++answered == members.size();
          }
          if (last) {
            all_done.Notify();
          } else {
            start_next();
          }
        });
  };
  const absl::Time start = absl::Now();
  for (int k = 0; k < in_flight; ++k) start_next();
  all_done.WaitForNotification();
  result.elapsed = absl::Now() - start;
  return result;
}

int Main() {
  SetMinLogSeverity(LogSeverity::kWarning);
  const int workers = absl::GetFlag(FLAGS_workers);
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  std::string target = absl::GetFlag(FLAGS_coordinator);
  std::unique_ptr<Storage> storage;  // outlives the coordinator
  std::unique_ptr<Coordinator> coordinator;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> client_tls =
      MakeChannelCredentials({absl::GetFlag(FLAGS_tls_ca), "", ""});
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_tls =
      MakeServerCredentials(
          {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), ""});
  if (!client_tls.ok() || !server_tls.ok()) {
    std::fprintf(stderr, "%s %s\n", client_tls.status().ToString().c_str(),
                 server_tls.status().ToString().c_str());
    return 1;
  }
  ClientCredentials() = *client_tls;
  if (target.empty()) {
    CoordinatorConfig config;
    config.listen_address = "127.0.0.1:0";
    config.credentials = *server_tls;
    StorageSpec spec;
    spec.state_dir = absl::GetFlag(FLAGS_state_dir);
    spec.etcd = absl::GetFlag(FLAGS_etcd);
    spec.etcd_prefix = absl::GetFlag(FLAGS_etcd_prefix);
    absl::StatusOr<std::unique_ptr<Storage>> opened = OpenStorage(spec);
    if (!opened.ok()) {
      std::fprintf(stderr, "%s\n", opened.status().ToString().c_str());
      return 1;
    }
    storage = *std::move(opened);
    config.storage = storage.get();
    if (absl::GetFlag(FLAGS_tokens)) config.admin_token = kAdminToken;
    coordinator = std::make_unique<Coordinator>(config);
    absl::Status started = coordinator->Start();
    if (!started.ok()) {
      std::fprintf(stderr, "cannot start the coordinator: %s\n",
                   started.ToString().c_str());
      return 1;
    }
    target = absl::StrCat("127.0.0.1:", coordinator->port());
  }
  const int channel_count = absl::GetFlag(FLAGS_channels);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  if (channel_count > 0) channels = Connect(target, channel_count, true);

  const int nproc = std::max(1, absl::GetFlag(FLAGS_nproc_per_node));
  if (workers % nproc != 0) {
    std::fprintf(stderr, "--workers must be a multiple of --nproc_per_node\n");
    return 1;
  }
  if (absl::GetFlag(FLAGS_tokens) &&
      !CreateJobWithToken(target, kAdminToken,
                          BenchJobConfig(workers, nproc, timeout))) {
    return 1;
  }
  const std::string join_client = absl::GetFlag(FLAGS_join_client);
  if (join_client != "h2" && join_client != "grpc") {
    std::fprintf(stderr, "--join_client must be h2 or grpc, not '%s'\n",
                 join_client.c_str());
    return 1;
  }
  const bool use_h2 = join_client == "h2" && channel_count > 0;
  if (use_h2 && !absl::GetFlag(FLAGS_tls_ca).empty()) {
    std::fprintf(stderr, "--join_client=h2 speaks plain text: use "
                         "--join_client=grpc with TLS\n");
    return 1;
  }
  std::unique_ptr<H2UnaryClient> h2;
  if (use_h2) {
    absl::StatusOr<std::unique_ptr<H2UnaryClient>> connected =
        H2UnaryClient::Connect(target, channel_count, absl::Seconds(10));
    if (!connected.ok()) {
      std::fprintf(stderr, "%s\n", connected.status().ToString().c_str());
      return 1;
    }
    h2 = *std::move(connected);
  }
  const int rss_pid = absl::GetFlag(FLAGS_coordinator_pid);
  const int64_t rss_before = ResidentBytes(rss_pid);
  JoinResult joins;
  if (!RunJoins(target, channels, h2.get(), workers, nproc, timeout, &joins)) {
    std::printf("RESULT workers=%d ranked=timeout\n", workers);
    return 1;
  }
  if (channels.empty()) channels = Connect(target, 8, true);  // for the KV load
  const int64_t rss_after = ResidentBytes(rss_pid);
  std::printf("gradsync rendezvous: %d workers%s, %s%s, to %s\n", workers,
              nproc > 1 ? absl::StrCat(" as ", joins.calls, " nodes of ",
                                       nproc, " (JoinNode)")
                              .c_str()
                        : "",
              channel_count > 0
                  ? absl::StrCat("sharing ", channel_count, " connections")
                        .c_str()
                  : "one new connection each",
              use_h2 ? " (lean HTTP/2 client)" : " (gRPC C++ client)",
              target.c_str());
  std::printf("time until every worker has its rank: %.3f s  (#wrong %d, "
              "#failed %d%s%s)\n",
              absl::ToDoubleSeconds(joins.all_ranked), joins.wrong,
              joins.failed, joins.failed > 0 ? ": " : "",
              joins.first_error.c_str());
  const double per_join_us =
      absl::ToDoubleMicroseconds(joins.all_ranked) / joins.calls;
  const double bytes_per_rank =
      static_cast<double>(rss_after - rss_before) / workers;
  std::printf("time per join call: %.1f us; memory growth %.0f bytes per "
              "rank (%s)\n",
              per_join_us, bytes_per_rank,
              rss_pid > 0 ? "the coordinator's"
                          : "this process: coordinator and clients together");

  v1::Scope scope;
  scope.set_job_id(absl::GetFlag(FLAGS_job));
  scope.set_round(1);
  KvLoad kv_load(channels, scope, absl::GetFlag(FLAGS_kv_ops),
                 absl::GetFlag(FLAGS_kv_in_flight));
  KvResult kv = kv_load.Run();

  std::printf("\n%-10s %8s %10s %10s %10s %10s   (latency, ms)\n", "rpc", "n",
              "p50", "p90", "p99", "max");
  PrintRow("Join", joins.latencies.size(), Summarize(joins.latencies));
  PrintRow("KV.Set", kv.set_latencies.size(), Summarize(kv.set_latencies));
  PrintRow("KV.Get", kv.get_latencies.size(), Summarize(kv.get_latencies));
  double kv_rate = (kv.set_latencies.size() + kv.get_latencies.size()) /
                   absl::ToDoubleSeconds(kv.elapsed);
  std::printf("key-value: %.0f calls/s with %d in flight (#wrong %d, "
              "#failed %d)\n",
              kv_rate, absl::GetFlag(FLAGS_kv_in_flight), kv.wrong, kv.failed);
  CompletionResult ends;
  std::string end_state = "-";
  if (absl::GetFlag(FLAGS_completions) && !joins.members.empty()) {
    ends = RunCompletions(channels, joins.members,
                          absl::GetFlag(FLAGS_completions_in_flight));
    auto jobs = v1::Jobs::NewStub(channels.front());
    grpc::ClientContext context;
    Authorize(&context);
    v1::GetJobRequest request;
    request.set_job_id(absl::GetFlag(FLAGS_job));
    request.mutable_members()->set_none(true);
    v1::GetJobResponse response;
    const grpc::Status got = jobs->GetJob(&context, request, &response);
    end_state = got.ok() ? v1::JobState_Name(response.job().state())
                         : got.error_message();
    PrintRow("Completion", ends.latencies.size(), Summarize(ends.latencies));
    std::printf("completions: all %zu answered in %.3f s (%.1f us each; "
                "#failed %d%s%s); job %s\n",
                joins.members.size(), absl::ToDoubleSeconds(ends.elapsed),
                absl::ToDoubleMicroseconds(ends.elapsed) / joins.members.size(),
                ends.failed, ends.failed > 0 ? ": " : "",
                ends.first_error.c_str(), end_state.c_str());
  }
  std::printf("RESULT workers=%d nproc_per_node=%d client=%s ranked_s=%.4f "
              "per_join_us=%.1f wrong=%d failed=%d kv_calls_per_s=%.0f "
              "rss_bytes_per_rank=%.0f\n",
              workers, nproc, use_h2 ? "h2" : "grpc",
              absl::ToDoubleSeconds(joins.all_ranked),
              per_join_us, joins.wrong, joins.failed, kv_rate, bytes_per_rank);
  const bool ended = !absl::GetFlag(FLAGS_completions) ||
                     (ends.failed == 0 && end_state == "JOB_STATE_SUCCEEDED");
  return (joins.wrong + joins.failed + kv.wrong + kv.failed) == 0 && ended
             ? 0
             : 1;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Debian's abseil checks every mutex acquisition for lock-order cycles
  // (gRPC's own mutexes included): about 15% of the coordinator's CPU under
  // load. Tests keep the check; the service does not need it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return gradsync::Main();
}
