// A hostile client against the real gradsync-coordinator binary: for a
// bounded time, several threads call every RPC of every service at once,
// and one thread the HTTP port, with random and extreme values from a fixed
// seed: empty strings and strings up to and just past the 8 MiB message
// limit, strings that are not UTF-8, negative and huge integers, NaN and
// infinite doubles, unknown enum values, durations and timestamps out of
// range, huge repeated fields, bytes that are no message at all (random,
// truncated, nested past protobuf's depth limit), unknown methods, missing,
// wrong and oversized tokens, deadlines already past, calls cancelled
// midway, streams abandoned, connections dropped. Then:
//   - every call ended with a status, none later than kLateBound after its
//     deadline, and no HTTP request got a server error (5xx);
//   - the coordinator still serves: its health check says SERVING, a worker
//     creates, joins and completes a job and sets and gets a key, and
//     /metrics answers;
//   - its resident memory (VmRSS in /proc/PID/status) grew by less than
//     kRssGrowthBound.
// Memory is bounded by design, whatever a client sends: the managers cap
// every field's size, and the flags below cap jobs (--max_jobs), members
// per job (--max_world_size) and each job's key-value store
// (--max_kv_keys_per_job, --max_kv_bytes_per_job).
//
// GRADSYNC_HOSTILE_SEED=N replays another seed (the threads' interleaving
// still varies from run to run).
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/health.grpc.pb.h"
#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "proto/gradsync/v1/kv.grpc.pb.h"
#include "proto/gradsync/v1/rendezvous.grpc.pb.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using testing::CoordinatorProcess;
using testing::Runfile;
using testing::TempPath;

// How long the clients attack.
constexpr absl::Duration kLoad = absl::Seconds(20);
constexpr int kGrpcClients = 4;
// How long after its deadline a call may end on a loaded 2-core machine
// (13.6 s was seen while the whole suite ran beside it; a call the
// coordinator never ended would take forever).
constexpr absl::Duration kLateBound = absl::Seconds(30);
// The most resident memory the attack may leave the coordinator with.
constexpr int64_t kRssGrowthBound = int64_t{200} << 20;
// The coordinator's gRPC message limit (Coordinator::Start).
constexpr int64_t kMessageLimit = int64_t{8} << 20;
constexpr uint64_t kDefaultSeed = 20260101;
constexpr char kAdminToken[] = "hostile-test-admin-token";
// The valid job ids the clients use (their other ids are all invalid):
// fewer than --max_jobs, so that the worker after the attack can still
// create its job.
const std::vector<std::string> kJobIds = {
    "a", "b", "c", "job-1", "job-2", "x9", "z", "a-long-job-name-0123456789"};
constexpr int kMaxJobs = 10;
// Every method of every gradsync.v1 service, for raw calls.
const std::vector<std::string> kMethods = {
    "/gradsync.v1.Rendezvous/Join",      "/gradsync.v1.Rendezvous/JoinNode",
    "/gradsync.v1.Rendezvous/Leave",     "/gradsync.v1.KeyValue/Set",
    "/gradsync.v1.KeyValue/Get",         "/gradsync.v1.KeyValue/Add",
    "/gradsync.v1.KeyValue/CompareAndSet", "/gradsync.v1.KeyValue/Wait",
    "/gradsync.v1.KeyValue/Delete",      "/gradsync.v1.KeyValue/List",
    "/gradsync.v1.Jobs/CreateJob",       "/gradsync.v1.Jobs/GetJob",
    "/gradsync.v1.Jobs/ListJobs",        "/gradsync.v1.Jobs/WatchJob",
    "/gradsync.v1.Monitor/Heartbeat",    "/gradsync.v1.Monitor/NodeHeartbeat",
    "/gradsync.v1.Monitor/ReportCompletion", "/gradsync.v1.Jobs/NoSuchMethod",
    "/grpc.health.v1.Health/Check",      "/no.such.Service/Method"};

uint64_t Seed() {
  const char* text = std::getenv("GRADSYNC_HOSTILE_SEED");
  uint64_t seed = kDefaultSeed;
  if (text != nullptr && !absl::SimpleAtoi(text, &seed)) seed = kDefaultSeed;
  return seed;
}

// Random and extreme values from one seed. Not thread-safe: one per thread.
class Chaos {
 public:
  explicit Chaos(uint64_t seed) : rng_(seed) {}

  // Starts a call: at most one huge string in it, and only in some.
  void NewCall() { huge_left_ = OneIn(120) ? 1 : 0; }

  int64_t Between(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool OneIn(int64_t n) { return Between(1, n) == 1; }
  template <typename T>
  const T& Pick(const std::vector<T>& from) {
    return from[Between(0, static_cast<int64_t>(from.size()) - 1)];
  }

  std::string Bytes(size_t size) {
    std::string out(size, '\0');
    for (char& c : out) c = static_cast<char>(Between(0, 255));
    return out;
  }

  // A string field: empty, text, text that is not UTF-8, control
  // characters, long; now and then huge (up to or just past the limit).
  std::string Text() {
    if (huge_left_ > 0 && OneIn(3)) {
      --huge_left_;
      const int64_t size = Pick(std::vector<int64_t>{
          Between(1 << 16, 1 << 20), kMessageLimit - 1024, kMessageLimit + 1});
      std::string out(size, 'x');
      if (OneIn(2)) out.replace(0, 64, Bytes(64));  // and not UTF-8
      return out;
    }
    switch (Between(0, 9)) {
      case 0: return "";
      case 1: return Bytes(Between(1, 24));
      case 2: return "\xff\xfe\xc3(";
      case 3: return std::string(Between(1, 2000), static_cast<char>('a' + Between(0, 25)));
      case 4: return "\xc3\xa9\xf0\x9f\x98\x80\"\\\n\t\r<script>'";
      case 5: return std::string("nul\0inside", 10);
      default: return absl::StrCat("t", Between(0, 5));
    }
  }
  // Mostly a valid job id of kJobIds; else one that is not valid.
  std::string JobId() {
    if (!OneIn(6)) return Pick(kJobIds);
    switch (Between(0, 5)) {
      case 0: return "";
      case 1: return "UPPER";
      case 2: return "-dash";
      case 3: return std::string(64, 'a');  // one past the limit
      case 4: return "a/b";
      default: return absl::StrCat("\xff", Text());
    }
  }
  std::string Incarnation() {
    return OneIn(5) ? Text() : absl::StrCat("i", Between(0, 7));
  }
  int64_t Int64() {
    switch (Between(0, 9)) {
      case 0: return std::numeric_limits<int64_t>::min();
      case 1: return std::numeric_limits<int64_t>::max();
      case 2: return -1;
      case 3: return std::numeric_limits<int32_t>::max() + int64_t{1};
      case 4: return std::numeric_limits<int32_t>::min();
      case 5: return static_cast<int64_t>(rng_());
      default: return Between(0, 5);
    }
  }
  int32_t Int32() {
    switch (Between(0, 7)) {
      case 0: return std::numeric_limits<int32_t>::min();
      case 1: return std::numeric_limits<int32_t>::max();
      case 2: return -1;
      case 3: return static_cast<int32_t>(rng_());
      default: return static_cast<int32_t>(Between(0, 5));
    }
  }
  // Small and plausible mostly (so that calls get past validation), else
  // extreme.
  int64_t Round() { return OneIn(4) ? Int64() : Between(0, 4); }
  int32_t Rank() { return OneIn(4) ? Int32() : static_cast<int32_t>(Between(0, 4)); }
  double Double() {
    switch (Between(0, 9)) {
      case 0: return std::numeric_limits<double>::quiet_NaN();
      case 1: return std::numeric_limits<double>::infinity();
      case 2: return -std::numeric_limits<double>::infinity();
      case 3: return -0.0;
      case 4: return std::numeric_limits<double>::denorm_min();
      case 5: return std::numeric_limits<double>::max();
      case 6: return std::numeric_limits<double>::lowest();
      default: return std::uniform_real_distribution<double>(-10, 100)(rng_);
    }
  }
  // A valid value of an enum whose values are 0..`max`, or any int.
  template <typename Enum>
  Enum EnumValue(int max) {
    return static_cast<Enum>(OneIn(4) ? Int32() : Between(0, max));
  }
  // Unset, plausible, negative, or out of protobuf's range (seconds past
  // 10,000 years, nanos outside +-999,999,999, signs that disagree).
  template <typename Message>
  void Time(Message* m) {
    switch (Between(0, 7)) {
      case 0: return;
      case 1: m->set_seconds(Int64()); m->set_nanos(Int32()); return;
      case 2: m->set_seconds(-Between(1, 100)); return;
      case 3: m->set_seconds(315576000001); return;
      case 4: m->set_seconds(1); m->set_nanos(-1); return;
      case 5: m->set_nanos(1000000000); return;
      default: m->set_seconds(Between(0, 3)); m->set_nanos(Between(0, 999999999)); return;
    }
  }
  // A repeated field's length: mostly a few, now and then thousands.
  int Count(int few) {
    return OneIn(60) ? static_cast<int>(Between(1000, 20000))
                     : static_cast<int>(Between(0, few));
  }
  // Bytes that may not be a message: random, a valid `message` cut short
  // or with bytes changed, groups nested past protobuf's depth limit, a
  // length that runs past the end, an overlong varint.
  std::string RawMessage(const google::protobuf::Message& message) {
    std::string out = message.SerializeAsString();
    switch (Between(0, 6)) {
      case 0: return Bytes(Between(0, 300));
      case 1: return out.substr(0, Between(0, out.size()));
      case 2:
        for (int i = 0; i < 4 && !out.empty(); ++i) {
          out[Between(0, out.size() - 1)] = static_cast<char>(Between(0, 255));
        }
        return out;
      case 3: return std::string(Between(101, 100000), '\x7b');  // start group 15
      case 4: return std::string("\x7a\xff\xff\xff\xff\x07", 6) + "short";
      case 5: return std::string(11, '\xff') + out;
      default: return out;
    }
  }

 private:
  std::mt19937_64 rng_;
  int huge_left_ = 0;
};

void FillConfig(Chaos& c, v1::JobConfig* config) {
  config->set_job_id(c.JobId());
  config->set_min_nodes(c.OneIn(4) ? c.Int32() : c.Between(0, 3));
  config->set_max_nodes(c.OneIn(4) ? c.Int32() : c.Between(0, 4));
  config->set_nproc_per_node(c.OneIn(4) ? c.Int32() : c.Between(0, 3));
  c.Time(config->mutable_join_timeout());
  c.Time(config->mutable_last_call_timeout());
  config->set_backend(c.EnumValue<v1::Backend>(3));
  c.Time(config->mutable_heartbeat_interval());
  config->set_missed_heartbeats(c.OneIn(3) ? c.Int32() : c.Between(0, 5));
  config->set_failure_policy(c.EnumValue<v1::FailurePolicy>(2));
  c.Time(config->mutable_straggler_threshold());
  c.Time(config->mutable_hang_timeout());
}

void FillNode(Chaos& c, v1::NodeDescriptor* node) {
  node->set_node_id(c.OneIn(2) ? c.Text() : "");
  node->set_hostname(c.OneIn(3) ? c.Text() : absl::StrCat("host-", c.Between(0, 3)));
  for (int i = c.Count(2); i > 0; --i) node->add_addresses(c.Text());
  node->set_pid(c.Int64());
  node->set_incarnation_id(c.Incarnation());
  node->set_device_type(c.EnumValue<v1::DeviceType>(2));
  node->set_device_count(c.Int32());
  node->set_nccl_available(c.OneIn(2));
}

void FillMetrics(Chaos& c, v1::WorkerMetrics* m) {
  if (c.OneIn(3)) return;
  m->set_state(c.EnumValue<v1::WorkerState>(5));
  m->set_step(c.Int64());
  m->set_samples_per_second(c.Double());
  m->mutable_step_timings()->set_step_seconds(c.Double());
  m->mutable_step_timings()->set_communication_seconds(c.Double());
  for (int i = c.Count(3); i > 0; --i) {
    v1::BucketStats* b = m->add_buckets();
    b->set_index(c.Int32());
    b->set_bytes(c.Int64());
    b->set_allreduce_seconds(c.Double());
    b->set_algbw_bytes_per_second(c.Double());
  }
  m->set_last_started_collective(c.Int64());
  m->set_last_finished_collective(c.Int64());
  for (int i = c.Count(3); i > 0; --i) {
    v1::CollectiveFingerprint* f = m->add_recent_collectives();
    f->set_sequence(c.Int64());
    f->set_op(c.Text());
    f->set_dtype(c.Text());
    f->set_count(c.Int64());
    f->set_bucket_index(c.Int32());
  }
  for (int i = c.Count(2); i > 0; --i) {
    v1::StepReady* r = m->add_first_bucket_ready();
    r->set_step(c.Int64());
    c.Time(r->mutable_time());
  }
  m->set_rss_bytes(c.Int64());
  m->set_gpu_memory_bytes(c.Int64());
  m->set_last_error(c.Text());
  c.Time(m->mutable_round_start()->mutable_process_group());
  c.Time(m->mutable_round_start()->mutable_first_step());
  m->set_cpu_seconds(c.Double());
}

void FillMember(Chaos& c, v1::MemberRef* member) {
  member->set_job_id(c.JobId());
  member->set_round(c.Round());
  member->set_rank(c.Rank());
  member->set_incarnation_id(c.Incarnation());
}

void FillScope(Chaos& c, v1::Scope* scope) {
  scope->set_job_id(c.JobId());
  scope->set_round(c.Round());
}

std::string Key(Chaos& c) { return c.OneIn(3) ? c.Text() : absl::StrCat("k", c.Between(0, 5)); }

void FillQuery(Chaos& c, v1::MemberQuery* query) {
  query->set_none(c.OneIn(4));
  query->set_rank_from(c.Rank());
  query->set_rank_to(c.Rank());
  query->set_unhealthy_only(c.OneIn(3));
  query->set_page_size(c.Rank());
  query->set_page_token(c.OneIn(2) ? c.Text() : absl::StrCat(c.Int32()));
}

// What the clients saw. Each thread fills its own; merged at the end.
struct Tally {
  int64_t calls = 0;      // ended with a status
  int64_t abandoned = 0;  // streams dropped without waiting for theirs
  std::map<std::string, std::map<std::string, int64_t>> outcomes;  // what -> how -> n
  absl::Duration latest = -absl::InfiniteDuration();  // ended after deadline
  std::vector<std::string> late;  // calls past kLateBound after their deadline
  // The first few HTTP server errors: the request and the answer's body.
  std::vector<std::string> server_errors;

  void Merge(const Tally& other) {
    calls += other.calls;
    abandoned += other.abandoned;
    for (const auto& [what, hows] : other.outcomes) {
      for (const auto& [how, n] : hows) outcomes[what][how] += n;
    }
    latest = std::max(latest, other.latest);
    late.insert(late.end(), other.late.begin(), other.late.end());
    server_errors.insert(server_errors.end(), other.server_errors.begin(),
                         other.server_errors.end());
  }
};

std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
      "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : absl::StrCat("code ", i);
}

// Tokens of jobs the clients created, shared by the threads.
class Tokens {
 public:
  void Add(const std::string& token) {
    absl::MutexLock lock(&mu_);
    if (tokens_.size() < 64) tokens_.push_back(token);
  }
  std::string Any(Chaos& c) {
    absl::MutexLock lock(&mu_);
    return tokens_.empty() ? std::string() : c.Pick(tokens_);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> tokens_ ABSL_GUARDED_BY(mu_);
};

// One hostile gRPC client: its own connection (and now and then a fresh
// one, dropped after one call), calling at random until `end`.
class GrpcClient {
 public:
  GrpcClient(std::string address, uint64_t seed, Tokens* tokens)
      : address_(std::move(address)), chaos_(seed), tokens_(tokens) {
    Connect(&main_);
  }

  void Run(absl::Time end) {
    while (absl::Now() < end) {
      chaos_.NewCall();
      if (chaos_.OneIn(100)) {
        Stubs fresh;
        Connect(&fresh);
        CallOne(fresh);
      } else {
        CallOne(main_);
      }
    }
  }
  const Tally& tally() const { return tally_; }

 private:
  struct Stubs {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Rendezvous::Stub> rendezvous;
    std::unique_ptr<v1::KeyValue::Stub> kv;
    std::unique_ptr<v1::Jobs::Stub> jobs;
    std::unique_ptr<v1::Monitor::Stub> monitor;
    std::unique_ptr<grpc::GenericStub> generic;
  };
  void Connect(Stubs* s) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    // A channel of its own, not one shared with the other clients.
    args.SetInt("hostile_client_channel", static_cast<int>(chaos_.Between(0, 1 << 30)));
    s->channel = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
    s->rendezvous = v1::Rendezvous::NewStub(s->channel);
    s->kv = v1::KeyValue::NewStub(s->channel);
    s->jobs = v1::Jobs::NewStub(s->channel);
    s->monitor = v1::Monitor::NewStub(s->channel);
    s->generic = std::make_unique<grpc::GenericStub>(s->channel);
  }

  // A deadline (mostly up to 2 s; sometimes past already) and a token
  // (mostly the admin's; else a job's, none, a wrong one or an oversized
  // one) for a call; returns the deadline.
  absl::Time Prepare(grpc::ClientContext* context) {
    const absl::Time deadline =
        chaos_.OneIn(20) ? absl::Now() - absl::Seconds(1)
                         : absl::Now() + absl::Milliseconds(chaos_.Between(1, 2000));
    context->set_deadline(absl::ToChronoTime(deadline));
    switch (chaos_.Between(0, 9)) {
      case 0: break;
      case 1: context->AddMetadata("authorization", "Bearer " + tokens_->Any(chaos_)); break;
      case 2: context->AddMetadata("authorization", "Bearer not-a-token"); break;
      case 3:  // printable: gRPC refuses other metadata before sending it
        context->AddMetadata("authorization", std::string(chaos_.Between(0, 20000), 'A'));
        break;
      default: context->AddMetadata("authorization", absl::StrCat("Bearer ", kAdminToken));
    }
    return deadline;
  }

  void Ended(const std::string& what, const grpc::Status& status, absl::Time deadline) {
    ++tally_.calls;
    ++tally_.outcomes[what][CodeName(status.error_code())];
    tally_.latest = std::max(tally_.latest, absl::Now() - deadline);
  }

  // A unary call that `start(context, done)` begins; now and then cancelled
  // midway. Waits for its status.
  void Unary(const std::string& what,
             const std::function<void(grpc::ClientContext*,
                                      std::function<void(grpc::Status)>)>& start) {
    grpc::ClientContext context;
    const absl::Time deadline = Prepare(&context);
    absl::Notification done;
    grpc::Status status;
    start(&context, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    if (chaos_.OneIn(8) &&
        !done.WaitForNotificationWithTimeout(absl::Milliseconds(chaos_.Between(0, 50)))) {
      context.TryCancel();
    }
    if (!done.WaitForNotificationWithDeadline(deadline + kLateBound)) {
      tally_.late.push_back(absl::StrCat(what, ": no status ",
                                         absl::FormatDuration(kLateBound),
                                         " after its deadline"));
      context.TryCancel();
      done.WaitForNotification();
    }
    Ended(what, status, deadline);
  }

  // A bidirectional stream: a few messages, answers read now and then, then
  // a half-close, a cancel, or abandoned without a word.
  template <typename Request, typename Response>
  void Bidi(const std::string& what,
            const std::function<std::unique_ptr<grpc::ClientReaderWriter<Request, Response>>(
                grpc::ClientContext*)>& open,
            const std::function<void(Request*)>& fill) {
    grpc::ClientContext context;
    const absl::Time deadline = Prepare(&context);
    auto stream = open(&context);
    Response response;
    for (int i = chaos_.Count(5); i > 0; --i) {
      Request request;
      fill(&request);
      if (!stream->Write(request)) break;
      if (chaos_.OneIn(2) && !stream->Read(&response)) break;
    }
    switch (chaos_.Between(0, 2)) {
      case 0:  // abandoned: dropping the call cancels it
        ++tally_.abandoned;
        ++tally_.outcomes[what]["abandoned"];
        return;
      case 1:
        context.TryCancel();
        break;
      default:
        stream->WritesDone();
        while (stream->Read(&response)) {
        }
        break;
    }
    Ended(what, stream->Finish(), deadline);
  }

  void CallOne(Stubs& s) {
    Chaos& c = chaos_;
    switch (c.Between(0, 18)) {
      case 0: {
        v1::JoinRequest r;
        r.set_job_id(c.JobId());
        if (!c.OneIn(3)) FillConfig(c, r.mutable_config());
        FillNode(c, r.mutable_node());
        r.set_last_round(c.Round());
        r.set_has_state(c.OneIn(2));
        r.set_committed_step(c.Int64());
        v1::JoinResponse a;
        Unary("Join", [&](auto* ctx, auto done) {
          s.rendezvous->async()->Join(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 1: {
        v1::JoinNodeRequest r;
        r.set_job_id(c.JobId());
        if (!c.OneIn(3)) FillConfig(c, r.mutable_config());
        for (int i = c.Count(4); i > 0; --i) {
          v1::ProcessJoin* p = r.add_processes();
          FillNode(c, p->mutable_node());
          p->set_last_round(c.Round());
          p->set_committed_step(c.Int64());
        }
        v1::JoinNodeResponse a;
        Unary("JoinNode", [&](auto* ctx, auto done) {
          s.rendezvous->async()->JoinNode(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 2: {
        v1::LeaveRequest r;
        r.set_job_id(c.JobId());
        r.set_incarnation_id(c.Incarnation());
        v1::LeaveResponse a;
        Unary("Leave", [&](auto* ctx, auto done) {
          s.rendezvous->async()->Leave(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 3: {
        v1::SetRequest r;
        FillScope(c, r.mutable_scope());
        r.set_key(Key(c));
        r.set_value(c.OneIn(10) ? c.Bytes(c.Between(0, 1 << 20)) : c.Text());
        v1::SetResponse a;
        Unary("Set", [&](auto* ctx, auto done) {
          s.kv->async()->Set(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 4: {
        v1::GetRequest r;
        FillScope(c, r.mutable_scope());
        r.set_key(Key(c));
        v1::GetResponse a;
        Unary("Get", [&](auto* ctx, auto done) {
          s.kv->async()->Get(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 5: {
        v1::AddRequest r;
        FillScope(c, r.mutable_scope());
        r.set_key(Key(c));
        r.set_delta(c.Int64());
        v1::AddResponse a;
        Unary("Add", [&](auto* ctx, auto done) {
          s.kv->async()->Add(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 6: {
        v1::CompareAndSetRequest r;
        FillScope(c, r.mutable_scope());
        r.set_key(Key(c));
        r.set_expected(c.Text());
        r.set_expect_absent(c.OneIn(2));
        r.set_desired(c.Text());
        v1::CompareAndSetResponse a;
        Unary("CompareAndSet", [&](auto* ctx, auto done) {
          s.kv->async()->CompareAndSet(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 7: {
        v1::WaitRequest r;
        FillScope(c, r.mutable_scope());
        for (int i = c.OneIn(40) ? 100001 : c.Count(3); i > 0; --i) {
          r.add_keys(Key(c));
        }
        r.set_timeout_ms(c.OneIn(2) ? c.Int64() : c.Between(0, 3000));
        v1::WaitResponse a;
        Unary("Wait", [&](auto* ctx, auto done) {
          s.kv->async()->Wait(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 8: {
        v1::DeleteRequest r;
        FillScope(c, r.mutable_scope());
        r.set_key(Key(c));
        v1::DeleteResponse a;
        Unary("Delete", [&](auto* ctx, auto done) {
          s.kv->async()->Delete(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 9: {
        v1::ListRequest r;
        FillScope(c, r.mutable_scope());
        r.set_prefix(c.OneIn(2) ? "" : c.Text());
        r.set_keys_only(c.OneIn(2));
        v1::ListResponse a;
        Unary("List", [&](auto* ctx, auto done) {
          s.kv->async()->List(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 10: {
        v1::CreateJobRequest r;
        FillConfig(c, r.mutable_config());
        v1::CreateJobResponse a;
        Unary("CreateJob", [&](auto* ctx, auto done) {
          s.jobs->async()->CreateJob(ctx, &r, &a, std::move(done));
        });
        if (!a.token().empty()) tokens_->Add(a.token());
        return;
      }
      case 11: {
        v1::GetJobRequest r;
        r.set_job_id(c.JobId());
        r.set_with_buckets(c.OneIn(2));
        if (!c.OneIn(3)) FillQuery(c, r.mutable_members());
        v1::GetJobResponse a;
        Unary("GetJob", [&](auto* ctx, auto done) {
          s.jobs->async()->GetJob(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 12: {
        v1::ListJobsRequest r;
        v1::ListJobsResponse a;
        Unary("ListJobs", [&](auto* ctx, auto done) {
          s.jobs->async()->ListJobs(ctx, &r, &a, std::move(done));
        });
        return;
      }
      case 13: {  // a watch: read a few updates, then end it one way or another
        v1::WatchJobRequest r;
        r.set_job_id(c.JobId());
        r.set_min_interval_ms(c.OneIn(2) ? c.Int64() : c.Between(0, 200));
        r.set_with_buckets(c.OneIn(2));
        if (!c.OneIn(3)) FillQuery(c, r.mutable_members());
        grpc::ClientContext context;
        const absl::Time deadline = Prepare(&context);
        auto reader = s.jobs->WatchJob(&context, r);
        v1::WatchJobResponse update;
        for (int i = c.Between(0, 4); i > 0 && reader->Read(&update); --i) {
        }
        switch (c.Between(0, 2)) {
          case 0:
            ++tally_.abandoned;
            ++tally_.outcomes["WatchJob"]["abandoned"];
            return;
          case 1:
            context.TryCancel();
            break;
          default:
            while (reader->Read(&update)) {
            }
        }
        Ended("WatchJob", reader->Finish(), deadline);
        return;
      }
      case 14: {
        Bidi<v1::HeartbeatRequest, v1::HeartbeatResponse>(
            "Heartbeat", [&](auto* ctx) { return s.monitor->Heartbeat(ctx); },
            [&](v1::HeartbeatRequest* h) {
              FillMember(c, h->mutable_member());
              FillMetrics(c, h->mutable_metrics());
            });
        return;
      }
      case 15: {
        Bidi<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse>(
            "NodeHeartbeat", [&](auto* ctx) { return s.monitor->NodeHeartbeat(ctx); },
            [&](v1::NodeHeartbeatRequest* n) {
              for (int i = c.Count(4); i > 0; --i) {
                v1::HeartbeatRequest* h = n->add_heartbeats();
                FillMember(c, h->mutable_member());
                if (c.OneIn(4)) FillMetrics(c, h->mutable_metrics());
              }
              for (int i = c.Count(1); i > 0; --i) FillMember(c, n->add_closed());
            });
        return;
      }
      case 16: {
        v1::ReportCompletionRequest r;
        FillMember(c, r.mutable_member());
        r.set_success(c.OneIn(2));
        r.set_exit_code(c.Int32());
        r.set_message(c.Text());
        FillMetrics(c, r.mutable_metrics());
        v1::ReportCompletionResponse a;
        Unary("ReportCompletion", [&](auto* ctx, auto done) {
          s.monitor->async()->ReportCompletion(ctx, &r, &a, std::move(done));
        });
        return;
      }
      default: {  // bytes that may be no message, to any method
        v1::JoinRequest model;
        model.set_job_id(c.JobId());
        FillNode(c, model.mutable_node());
        const std::string bytes = c.RawMessage(model);
        grpc::Slice slice(bytes);
        grpc::ByteBuffer request(&slice, 1);
        grpc::ByteBuffer response;
        const std::string method = c.Pick(kMethods);
        const bool ours = absl::StartsWith(method, "/gradsync.v1.") &&
                          method != "/gradsync.v1.Jobs/NoSuchMethod";
        Unary(ours ? "raw bytes" : "raw bytes, not our method", [&](auto* ctx, auto done) {
          s.generic->UnaryCall(ctx, method, grpc::StubOptions(), &request, &response,
                               std::move(done));
        });
        return;
      }
    }
  }

  const std::string address_;
  Chaos chaos_;
  Tokens* const tokens_;
  Stubs main_;
  Tally tally_;
};

// GET (mostly) requests with hostile targets and headers on the HTTP port
// until `end`; tallies their status codes ("no answer" when the request
// failed: a target the server refuses to read, a timeout).
void HttpClient(int port, uint64_t seed, Tokens* tokens, absl::Time end, Tally* tally) {
  Chaos c(seed);
  auto http = std::make_unique<httplib::Client>("127.0.0.1", port);
  while (absl::Now() < end) {
    c.NewCall();
    if (c.OneIn(10)) http = std::make_unique<httplib::Client>("127.0.0.1", port);
    http->set_connection_timeout(5);
    http->set_read_timeout(10);
    std::string target = c.Pick(std::vector<std::string>{
        "/", "/metrics", "/api/jobs", "/api/job", "/api/job", "/nothing",
        "/api/job/", "//metrics"});
    std::vector<std::string> params;
    for (int i = c.Between(0, 5); i > 0; --i) {
      const std::string name = c.Pick(std::vector<std::string>{
          "id", "members", "from", "to", "limit", "id", "x"});
      std::string value;
      switch (c.Between(0, 4)) {
        case 0: value = c.JobId(); break;
        case 1: value = absl::StrCat(c.Int64()); break;
        case 2: value = c.Pick(std::vector<std::string>{"all", "unhealthy", "none", "auto", ""}); break;
        default: value = c.Text().substr(0, 3000);
      }
      params.push_back(name + "=" + httplib::detail::encode_query_param(value));
    }
    if (!params.empty()) target += "?" + absl::StrJoin(params, "&");
    if (c.OneIn(50)) target += std::string(c.Between(1, 20000), 'q');
    httplib::Headers headers;
    switch (c.Between(0, 5)) {
      case 0: break;
      case 1: headers.emplace("Authorization", "Bearer " + tokens->Any(c)); break;
      case 2: headers.emplace("Authorization", std::string(c.Between(0, 9000), 'B')); break;
      default: headers.emplace("Authorization", absl::StrCat("Bearer ", kAdminToken));
    }
    const httplib::Result result = c.OneIn(10) ? http->Post(target, headers, c.Text(), "text/plain")
                                               : http->Get(target, headers);
    ++tally->calls;
    ++tally->outcomes["HTTP"][result ? absl::StrCat(result->status) : "no answer"];
    if (result && result->status >= 500 && tally->server_errors.size() < 5) {
      tally->server_errors.push_back(absl::StrCat(
          absl::CEscape(target.substr(0, 300)), " -> ", result->status, " ",
          absl::CEscape(result->body.substr(0, 300))));
    }
  }
}

// A field of /proc/PID/status in bytes ("VmRSS", "VmHWM"); -1 if unknown.
int64_t ProcBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    int64_t kib = -1;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.size() >= 2 && absl::SimpleAtoi(words[words.size() - 2], &kib)) {
      return kib << 10;
    }
  }
  return -1;
}

std::string MiB(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// grpc.health.v1.Health/Check for the whole server: SERVING is the answer
// 0x08 0x01 (field 1, varint 1).
::testing::AssertionResult Serving(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::ByteBuffer request(nullptr, 0);
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    return ::testing::AssertionFailure() << "health check: " << status.error_message();
  }
  std::vector<grpc::Slice> slices;
  std::string answer;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      answer.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  if (answer != std::string("\x08\x01", 2)) {
    return ::testing::AssertionFailure() << "health check answered '"
                                         << absl::CEscape(answer) << "', not SERVING";
  }
  return ::testing::AssertionSuccess();
}

class HostileClientTest : public ::testing::Test {
 protected:
  // One coordinator and one attack for the suite; each test checks one
  // consequence.
  static void SetUpTestSuite() {
    // Requests with strings that are not UTF-8 are the point; protobuf
    // would log each one it serializes.
    google::protobuf::SetLogHandler(nullptr);
    const std::string admin_file = TempPath("admin-token");
    std::ofstream(admin_file) << kAdminToken << "\n";
    const std::string metrics_port_file = TempPath("metrics-port");
    coordinator_ = new CoordinatorProcess();
    const ::testing::AssertionResult started = coordinator_->Start(
        Runfile("server/gradsync-coordinator"), "hostile",
        {"--auth=token", "--admin_token_file=" + admin_file,
         "--create_jobs_on_join=true", absl::StrCat("--max_jobs=", kMaxJobs),
         "--max_world_size=16", "--max_kv_keys_per_job=256",
         "--max_kv_bytes_per_job=2097152", "--metrics_listen=127.0.0.1:0",
         "--metrics_port_file=" + metrics_port_file});
    if (!started) {
      ADD_FAILURE() << started.message();
      return;
    }
    std::ifstream(metrics_port_file) >> metrics_port_;
    const pid_t pid = coordinator_->child().pid();
    // Warm: its threads and gRPC's buffers exist before the first reading.
    if (!Serving(coordinator_->address())) return;
    rss_before_ = ProcBytes(pid, "VmRSS");

    const uint64_t seed = Seed();
    Tokens tokens;
    std::vector<std::unique_ptr<GrpcClient>> clients;
    for (int i = 0; i < kGrpcClients; ++i) {
      clients.push_back(std::make_unique<GrpcClient>(coordinator_->address(),
                                                      seed + i, &tokens));
    }
    const absl::Time start = absl::Now();
    const absl::Time end = start + kLoad;
    std::vector<std::thread> threads;
    for (auto& client : clients) {
      threads.emplace_back([&client, end] { client->Run(end); });
    }
    Tally http;
    threads.emplace_back([&] {
      HttpClient(metrics_port_, seed + kGrpcClients, &tokens, end, &http);
    });
    for (std::thread& t : threads) t.join();
    const absl::Duration took = absl::Now() - start;
    tally_ = new Tally();
    for (auto& client : clients) tally_->Merge(client->tally());
    http_ = new Tally(http);
    rss_after_ = ProcBytes(pid, "VmRSS");
    const int64_t peak = ProcBytes(pid, "VmHWM");

    printf("hostile clients: seed %llu, %d gRPC clients and 1 HTTP client for %s\n",
           static_cast<unsigned long long>(seed), kGrpcClients,
           absl::FormatDuration(took).c_str());
    printf("gRPC calls: %lld ended with a status, %lld streams abandoned; "
           "latest end after a deadline %s\n",
           static_cast<long long>(tally_->calls),
           static_cast<long long>(tally_->abandoned),
           absl::FormatDuration(tally_->latest).c_str());
    for (const Tally* t : {tally_, http_}) {
      for (const auto& [what, hows] : t->outcomes) {
        std::vector<std::string> parts;
        for (const auto& [how, n] : hows) parts.push_back(absl::StrCat(how, " ", n));
        printf("  %-17s %s\n", what.c_str(), absl::StrJoin(parts, ", ").c_str());
      }
    }
    printf("coordinator VmRSS: %s before, %s after (%+.1f MiB; bound +%s), peak %s\n",
           MiB(rss_before_).c_str(), MiB(rss_after_).c_str(),
           (rss_after_ - rss_before_) / 1048576.0, MiB(kRssGrowthBound).c_str(),
           MiB(peak).c_str());
    fflush(stdout);
  }

  static void TearDownTestSuite() {
    if (coordinator_ != nullptr && coordinator_->child().running()) {
      EXPECT_TRUE(coordinator_->Stop());
    }
    delete coordinator_;
    delete tally_;
    delete http_;
    coordinator_ = nullptr;
    tally_ = http_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(tally_, nullptr) << "the attack did not run";
  }

  static CoordinatorProcess* coordinator_;
  static int metrics_port_;
  static Tally* tally_;  // the gRPC clients'
  static Tally* http_;   // the HTTP client's
  static int64_t rss_before_;
  static int64_t rss_after_;
};

CoordinatorProcess* HostileClientTest::coordinator_ = nullptr;
int HostileClientTest::metrics_port_ = 0;
Tally* HostileClientTest::tally_ = nullptr;
Tally* HostileClientTest::http_ = nullptr;
int64_t HostileClientTest::rss_before_ = -1;
int64_t HostileClientTest::rss_after_ = -1;

TEST_F(HostileClientTest, EveryCallEndsWithAStatusByItsDeadline) {
  EXPECT_GT(tally_->calls, 0);
  EXPECT_TRUE(tally_->late.empty()) << absl::StrJoin(tally_->late, "\n");
  EXPECT_LE(tally_->latest, kLateBound);
  // Calls of every kind were made and answered.
  for (const char* rpc :
       {"Join", "JoinNode", "Leave", "Set", "Get", "Add", "CompareAndSet", "Wait",
        "Delete", "List", "CreateJob", "GetJob", "ListJobs", "WatchJob",
        "Heartbeat", "NodeHeartbeat", "ReportCompletion", "raw bytes"}) {
    EXPECT_GT(tally_->outcomes[rpc].size(), 0u) << rpc << " was never called";
  }
}

// Bytes to one of our methods get an answer about them (INVALID_ARGUMENT
// when they do not parse, else one on their merits), never gRPC's own
// UNIMPLEMENTED or INTERNAL ("Unable to parse request") or UNKNOWN.
TEST_F(HostileClientTest, RawBytesAreNeverAnsweredAsAServerFault) {
  ASSERT_GT(tally_->outcomes["raw bytes"].size(), 0u);
  EXPECT_GT(tally_->outcomes["raw bytes"]["INVALID_ARGUMENT"], 0);
  for (const char* fault : {"UNIMPLEMENTED", "INTERNAL", "UNKNOWN"}) {
    EXPECT_EQ(tally_->outcomes["raw bytes"][fault], 0) << fault;
  }
}

TEST_F(HostileClientTest, HttpPortAnswersWithoutServerErrors) {
  EXPECT_GT(http_->calls, 0);
  for (const auto& [how, n] : http_->outcomes["HTTP"]) {
    EXPECT_NE(how[0], '5') << n << " HTTP requests were answered " << how;
  }
  EXPECT_TRUE(http_->server_errors.empty())
      << absl::StrJoin(http_->server_errors, "\n");
}

TEST_F(HostileClientTest, StillServesAWorkerAfterward) {
  ASSERT_TRUE(coordinator_->child().running()) << coordinator_->child().describe();
  EXPECT_TRUE(Serving(coordinator_->address()));

  ClientOptions options;
  options.target = coordinator_->address();
  options.token = kAdminToken;
  std::unique_ptr<CoordinatorClient> admin = *GrpcCoordinatorClient::Create(options);
  v1::JobConfig config;
  config.set_job_id("after-the-attack");
  config.set_min_nodes(1);
  config.set_max_nodes(1);
  config.set_nproc_per_node(1);
  absl::StatusOr<v1::CreateJobResponse> created = admin->CreateJob(config);
  ASSERT_TRUE(created.ok()) << created.status();

  options.token = created->token();
  std::unique_ptr<CoordinatorClient> worker = *GrpcCoordinatorClient::Create(options);
  v1::JoinRequest join;
  join.set_job_id(config.job_id());
  *join.mutable_node() = LocalNodeDescriptor();
  absl::StatusOr<v1::Assignment> assignment = worker->Join(join, absl::Seconds(30));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  v1::Scope scope;
  scope.set_job_id(config.job_id());
  scope.set_round(assignment->round());
  ASSERT_TRUE(worker->Set(scope, "address", "10.0.0.1:29500").ok());
  absl::StatusOr<std::string> value = worker->Get(scope, "address");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "10.0.0.1:29500");
  v1::ReportCompletionRequest done;
  done.mutable_member()->set_job_id(config.job_id());
  done.mutable_member()->set_round(assignment->round());
  done.mutable_member()->set_rank(assignment->rank());
  done.mutable_member()->set_incarnation_id(join.node().incarnation_id());
  done.set_success(true);
  absl::StatusOr<v1::JobState> state = worker->ReportCompletion(done);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::JOB_STATE_SUCCEEDED);

  httplib::Client http("127.0.0.1", metrics_port_);
  http.set_read_timeout(30);
  httplib::Result metrics =
      http.Get("/metrics", {{"Authorization", absl::StrCat("Bearer ", kAdminToken)}});
  ASSERT_TRUE(metrics) << "no answer from /metrics";
  EXPECT_EQ(metrics->status, 200);
}

TEST_F(HostileClientTest, ResidentMemoryStaysBounded) {
  ASSERT_GT(rss_before_, 0);
  ASSERT_GT(rss_after_, 0);
  EXPECT_LT(rss_after_ - rss_before_, kRssGrowthBound)
      << "VmRSS " << MiB(rss_before_) << " before the attack, "
      << MiB(rss_after_) << " after";
}

}  // namespace
}  // namespace gradsync
