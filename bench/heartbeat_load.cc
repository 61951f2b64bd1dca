// Heartbeat ingest load: N simulated workers, each with its own
// Monitor.Heartbeat stream (or, with --nproc_per_node, nodes of workers
// sharing a Monitor.NodeHeartbeat stream), send one heartbeat per second
// (--rate) to an in-process coordinator (or an external one, see below); the
// load is raised level by level (--members).
//
// For every level it reports the heartbeats the coordinator accepted per
// second against the offered rate, writes skipped because the previous one
// was still in flight (back-pressure), and — the correctness check — how many
// members the coordinator marked LOST or shows with a last heartbeat older
// than 2 intervals (#lost, #stale: both must be 0 for the level to count as
// sustained). At --status_members members it also times Jobs.GetJob of a
// job of that size while the load runs (p50/p99/max).
//
// Past the coordinator's capacity it sheds load (HeartbeatShedder): the
// heartbeat answers ask for a longer interval, which the simulated workers
// obey (--obey_interval: each stream keeps a read of its answers pending).
// --shed=off,on runs every level twice, side by side, each on a fresh
// coordinator: without shedding (as before it existed) and with it. The
// #stale check then allows 2 of the intervals the coordinator asks for.
// --max_heartbeat_rate caps the coordinator's ingest to reach its capacity
// cheaply (CoordinatorConfig::max_heartbeat_rate).
// --witness runs a small job beside the load in every level, in a process
// of its own (as another job runs on other hosts), and times how long the
// coordinator takes to find one of its members LOST, printing the LOST
// reason (job isolation: a flood in one job must not slow failure
// detection in another); a level of 0 members is the witness alone:
//   bazel-bin/bench/heartbeat_load --members=0,60000 --witness
//       --duration=20s --status_members=0
// With --obey_interval=false the simulated workers ignore the interval
// they are asked for (a buggy or hostile job), and --police=off,on runs
// every level with the coordinator reading such streams as they come and
// holding them back to what it asked (HeartbeatPolicer), side by side.
//
//   bazel run -c opt //bench:heartbeat_load -- --members=10000,50000,100000
//   bazel-bin/bench/heartbeat_load --members=30000,50000 --shed=off,on
//
// Members are grouped into jobs of --job_size (rendezvous through real
// Rendezvous.Join calls); streams share --channels client connections.
//
// With --coordinator=HOST:PORT (loopback) and --coordinator_pid=PID the load
// goes to a running gradsync-coordinator instead (started with
// --max_streams_per_connection=0), one level in one shedding mode, and the
// level reports that process's resident memory per member: after the joins
// and at the end of the measured heartbeating, each over its memory before
// the joins. The coordinator's own counters are not reachable from outside:
// heartbeats accepted, CPU and the shedding state are then not reported (the
// x column is the interval factor the workers were asked for).
//
//   bazel-bin/bench/heartbeat_load --members=10000 --status_members=0
//       --coordinator=127.0.0.1:PORT --coordinator_pid=PID
// (bench/coordinator_memory.sh starts coordinators and runs it so).
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/line_child.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/process_usage.h"
#include "proto/gradsync/v1/health.grpc.pb.h"
#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "proto/gradsync/v1/rendezvous.grpc.pb.h"
#include "server/coordinator.h"
#include "server/memory_available.h"

ABSL_FLAG(std::string, members, "10000,50000,100000",
          "comma-separated load levels: simulated workers heartbeating at once");
ABSL_FLAG(int, job_size, 10000, "members per job");
ABSL_FLAG(double, rate, 1.0, "heartbeats per second per member");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10),
          "how long each level is measured (after a warm-up of 2 intervals)");
ABSL_FLAG(int, channels, 8, "client connections the streams share");
ABSL_FLAG(int, completion_queues, 32, "the coordinator's --completion_queues");
ABSL_FLAG(int, client_queues, 8,
          "completion queues (each with a thread) of the simulated workers");
ABSL_FLAG(int, pacers, 2, "client threads that pace the heartbeats");
ABSL_FLAG(int, status_members, 10000,
          "time GetJob of a job of this many members at the level of exactly "
          "this many members (0: never)");
ABSL_FLAG(int, status_queries, 300,
          "GetJob calls to time, shared among --status_kinds");
ABSL_FLAG(std::string, status_kinds, "full,summary,page",
          "GetJob answers to time: full (every member), summary (no "
          "member), page (the unhealthy members, 50 at most); and metrics: "
          "the coordinator's whole /metrics text, rendered in process (every "
          "member of the level; not with --coordinator)");
ABSL_FLAG(std::string, shed, "on",
          "heartbeat load shedding of the coordinator: on, off, or a list "
          "(off,on) to run every level once per mode, side by side; with "
          "--coordinator one mode, the one it runs with (--shed_heartbeats), "
          "which is only reported");
ABSL_FLAG(std::string, police, "on",
          "the coordinator's holding back of streams that send faster than "
          "asked (--police_heartbeats): on, off, or a list (off,on) to run "
          "every level and --shed mode once per setting, side by side; not "
          "with --coordinator");
ABSL_FLAG(bool, grow_receive_windows, true,
          "the in-process coordinator's CoordinatorConfig::"
          "grow_receive_windows (false: HTTP/2's 64 KiB a stream)");
ABSL_FLAG(std::string, transport_memory_limit, "0",
          "the in-process coordinator's --transport_memory_limit (bytes, or "
          "a share such as 25% of the memory this process may use; 0: none)");
ABSL_FLAG(bool, obey_interval, true,
          "simulated workers read the coordinator's answers and send at the "
          "interval it asks for (a read pending per stream); false: answers "
          "are read only when a stream closes, and every member sends at "
          "--rate");
ABSL_FLAG(double, max_heartbeat_rate, 0,
          "cap the coordinator's heartbeat ingest at this many per second "
          "(0: no cap)");
ABSL_FLAG(bool, coordinator_logs, false,
          "print the coordinator's log lines (shedding decisions, members "
          "LOST) on stderr; otherwise errors only");
ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT (loopback) of a running gradsync-coordinator to load "
          "instead of an in-process one: one --members level (default: an "
          "in-process coordinator per level and --shed mode)");
ABSL_FLAG(bool, netns_harness, false,
          "with --coordinator: it may also be a simulated host of the "
          "fault-injection harness (tests/netns: 10.77.0.x, 10.78.0.x, "
          "addresses inside network namespaces the test made)");
ABSL_FLAG(int, coordinator_pid, 0,
          "with --coordinator (required): its process id, to report its "
          "resident memory");
ABSL_FLAG(bool, witness, false,
          "beside the load, a job of 3 members heartbeating at the same "
          "interval, in a process of its own (this binary, --witness_child); "
          "half-way through each level its rank 1 stops (its stream open, as "
          "a hung process's) and the level reports how long the coordinator "
          "took to find it LOST and why (a level of 0 members: the witness "
          "alone, the baseline)");
ABSL_FLAG(std::string, witness_child, "",
          "internal, for --witness: run only the witness job against the "
          "coordinator at this HOST:PORT, driven over stdin and stdout");
ABSL_FLAG(std::string, witness_job, "witness",
          "internal: with --witness_child, the witness's job id");
ABSL_FLAG(int, nproc_per_node, 1,
          "members per stream: above 1, the members of each simulated node "
          "share one Monitor.NodeHeartbeat stream and send their heartbeats "
          "as one message per interval, as gradsync launch does");

namespace gradsync {
namespace {

struct Percentiles {
  absl::Duration p50, p99, max;
};

Percentiles Summarize(std::vector<absl::Duration> samples) {
  Percentiles p;
  if (samples.empty()) return p;
  std::sort(samples.begin(), samples.end());
  p.p50 = samples[samples.size() / 2];
  p.p99 = samples[static_cast<size_t>(0.99 * (samples.size() - 1))];
  p.max = samples.back();
  return p;
}

std::vector<std::shared_ptr<grpc::Channel>> Connect(const std::string& target,
                                                    int count) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args;
    // A distinct argument and a local subchannel pool: one TCP connection
    // per channel.
    args.SetInt("gradsync.bench_channel", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Statuses of 10,000 members are ~2 MB: let one arrive without waiting
    // for flow-control window updates.
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
    args.SetMaxReceiveMessageSize(64 << 20);
    auto channel = grpc::CreateCustomChannel(
        target, grpc::InsecureChannelCredentials(), args);
    channel->WaitForConnected(std::chrono::system_clock::now() +
                              std::chrono::seconds(10));
    channels.push_back(std::move(channel));
  }
  return channels;
}

// Joins `size` members to job `job_id` (round 1) and returns their
// MemberRefs by rank. Empty on failure.
std::vector<v1::MemberRef> JoinJob(
    const std::vector<std::shared_ptr<grpc::Channel>>& channels,
    const std::string& job_id, int size) {
  struct Call {
    grpc::ClientContext context;
    v1::JoinRequest request;
    v1::JoinResponse response;
    grpc::Status status;
  };
  v1::JobConfig config;
  config.set_job_id(job_id);
  config.set_min_nodes(size);
  *config.mutable_last_call_timeout() = ToProtoDuration(absl::ZeroDuration());
  std::vector<std::unique_ptr<v1::Rendezvous::Stub>> stubs;
  for (const auto& c : channels) stubs.push_back(v1::Rendezvous::NewStub(c));
  std::vector<std::unique_ptr<Call>> calls(size);
  std::atomic<int> outstanding{size};
  absl::Notification done;
  for (int i = 0; i < size; ++i) {
    calls[i] = std::make_unique<Call>();
    Call* call = calls[i].get();
    call->request.set_job_id(job_id);
    *call->request.mutable_config() = config;
    v1::NodeDescriptor* node = call->request.mutable_node();
    node->set_node_id(absl::StrCat(job_id, "-node-", i));
    node->set_hostname(absl::StrCat("sim-host-", i % 1000));
    node->set_pid(100000 + i);
    node->set_incarnation_id(absl::StrCat(job_id, "-", i));
    node->set_device_type(v1::DEVICE_TYPE_CPU);
    node->set_device_count(1);
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::seconds(120));
    stubs[i % stubs.size()]->async()->Join(
        &call->context, &call->request, &call->response,
        [call, &outstanding, &done](grpc::Status status) {
          call->status = std::move(status);
          if (outstanding.fetch_sub(1) == 1) done.Notify();
        });
  }
  done.WaitForNotification();
  std::vector<v1::MemberRef> members(size);
  for (const auto& call : calls) {
    if (!call->status.ok()) {
      std::fprintf(stderr, "join failed: %s\n",
                   call->status.error_message().c_str());
      return {};
    }
    const v1::Assignment& a = call->response.assignment();
    v1::MemberRef& m = members[a.rank()];
    m.set_job_id(job_id);
    m.set_round(a.round());
    m.set_rank(a.rank());
    m.set_incarnation_id(call->request.node().incarnation_id());
  }
  return members;
}

// The heartbeats a simulated member sends: realistic ones, with a step's
// timings, two buckets, two collectives and a first-bucket-ready time.
v1::HeartbeatRequest FirstHeartbeat(v1::MemberRef member) {
  v1::HeartbeatRequest request;
  *request.mutable_member() = std::move(member);
  v1::WorkerMetrics* m = request.mutable_metrics();
  m->set_state(v1::WORKER_STATE_TRAINING);
  m->set_samples_per_second(512);
  v1::StepTimings* t = m->mutable_step_timings();
  t->set_step_seconds(0.25);
  t->set_forward_seconds(0.08);
  t->set_backward_seconds(0.12);
  t->set_communication_seconds(0.03);
  t->set_hidden_communication_seconds(0.02);
  for (int b = 0; b < 2; ++b) {
    v1::BucketStats* bucket = m->add_buckets();
    bucket->set_index(b);
    bucket->set_bytes(int64_t{25} << 20);
    bucket->set_allreduce_seconds(0.01);
    bucket->set_algbw_bytes_per_second(2.5e9);
  }
  m->set_rss_bytes(int64_t{6} << 30);
  return request;
}

void NextStep(v1::HeartbeatRequest* request, int64_t step, absl::Time now) {
  v1::WorkerMetrics* m = request->mutable_metrics();
  m->set_step(step);
  m->set_last_started_collective(2 * step);
  m->set_last_finished_collective(2 * step);
  m->clear_recent_collectives();
  for (int b = 0; b < 2; ++b) {
    v1::CollectiveFingerprint* f = m->add_recent_collectives();
    f->set_sequence(2 * step - 1 + b);
    f->set_op("allreduce");
    f->set_dtype("float32");
    f->set_count(int64_t{25} << 18);
    f->set_bucket_index(b);
  }
  m->clear_first_bucket_ready();
  v1::StepReady* ready = m->add_first_bucket_ready();
  ready->set_step(step);
  *ready->mutable_time() = ToProtoTime(now);
}

// One stream's heartbeats: a member's (Monitor.Heartbeat), or a node's
// members' batched in one message (Monitor.NodeHeartbeat).
struct MemberStream {
  using Request = v1::HeartbeatRequest;
  using Response = v1::HeartbeatResponse;
  static Request Make(std::vector<v1::MemberRef> members) {
    return FirstHeartbeat(std::move(members.front()));
  }
  static void Step(Request* r, int64_t step, absl::Time ready) {
    NextStep(r, step, ready);
  }
  static auto Prepare(v1::Monitor::Stub* stub, grpc::ClientContext* context,
                      grpc::CompletionQueue* cq) {
    return stub->PrepareAsyncHeartbeat(context, cq);
  }
  // The interval an answer asks for; zero when it says none.
  static absl::Duration Interval(const Response& r) {
    return FromProtoDuration(r.heartbeat_interval());
  }
};
struct NodeStream {
  using Request = v1::NodeHeartbeatRequest;
  using Response = v1::NodeHeartbeatResponse;
  static Request Make(std::vector<v1::MemberRef> members) {
    Request request;
    for (v1::MemberRef& m : members) {
      *request.add_heartbeats() = FirstHeartbeat(std::move(m));
    }
    return request;
  }
  static void Step(Request* r, int64_t step, absl::Time ready) {
    for (v1::HeartbeatRequest& h : *r->mutable_heartbeats()) {
      NextStep(&h, step, ready);
    }
  }
  static auto Prepare(v1::Monitor::Stub* stub, grpc::ClientContext* context,
                      grpc::CompletionQueue* cq) {
    return stub->PrepareAsyncNodeHeartbeat(context, cq);
  }
  // The members of a node share a job, so one interval: the longest asked.
  static absl::Duration Interval(const Response& r) {
    absl::Duration longest;
    for (const v1::MemberHeartbeatResponse& a : r.answers()) {
      longest = std::max(longest, FromProtoDuration(a.response().heartbeat_interval()));
    }
    return longest;
  }
};

// A simulated worker's (or node's) heartbeat stream, driven by the events
// of a client queue.
class Beater {
 public:
  enum class Event { kStarted, kWritten, kWritesDone, kRead, kFinished };
  struct Tag {
    Beater* beater;
    Event event;
  };
  virtual ~Beater() = default;
  // Sends the heartbeat(s) of step `step`, whose first bucket was ready at
  // `ready` on every rank (no straggler), unless the previous ones are still
  // in flight (then returns false: back-pressure).
  virtual bool Beat(int64_t step, absl::Time ready) = 0;
  // Send on every how many pacing cycles: the interval the coordinator
  // last asked for over the pacing one (1 until it asks for more).
  int every() const { return every_.load(std::memory_order_relaxed); }
  virtual void On(Event event, bool ok) = 0;
  // Half-closes once no write is in flight; Done() is true at the end.
  virtual void Close() = 0;
  // Cancels the call (a client that disconnects): for a stream whose
  // half-close waits behind the messages the coordinator holds back.
  virtual void Cancel() = 0;
  virtual bool Done() const = 0;
  virtual bool failed() const = 0;
  // Once failed(): what failed (the call's status, or "a write failed"
  // while it was still open), and when that was first seen.
  virtual std::string failure() const = 0;
  virtual absl::Time failed_at() const = 0;

 protected:
  std::atomic<int> every_{1};
};

// On the asynchronous API. Without --obey_interval a stream has no
// operation outstanding between heartbeats (its answers are read only when
// it closes), so client queues stay short (see CompletionQueues on why that
// matters with Debian's gRPC); with it, each stream keeps one read of its
// answers pending, as a real worker does, and sends at the interval the
// last answer asked for.
template <typename Kind>
class StreamBeater final : public Beater {
 public:
  // `pacing`: the interval the pacers send at (--rate); `obey`: read the
  // answers as they come and follow their interval.
  StreamBeater(v1::Monitor::Stub* stub, grpc::CompletionQueue* cq,
               std::vector<v1::MemberRef> members, absl::Duration pacing,
               bool obey)
      : pacing_(pacing), obey_(obey) {
    absl::MutexLock lock(&mu_);
    request_ = Kind::Make(std::move(members));
    busy_ = true;  // until the call has started
    stream_ = Kind::Prepare(stub, &context_, cq);
    stream_->StartCall(&started_tag_);
  }

  bool Beat(int64_t step, absl::Time ready) override {
    absl::MutexLock lock(&mu_);
    if (busy_ || closing_ || finishing_) return false;
    busy_ = true;
    Kind::Step(&request_, step, ready);
    stream_->Write(request_, &written_tag_);
    return true;
  }

  void On(Event event, bool ok) override {
    absl::MutexLock lock(&mu_);
    switch (event) {
      case Event::kStarted:
      case Event::kWritten:
        if (!ok) FailLocked();
        busy_ = false;
        if (event == Event::kStarted && obey_ && !reading_ && !finishing_) {
          reading_ = true;
          stream_->Read(&response_, &read_tag_);
        }
        if (closing_) CloseLocked();
        break;
      case Event::kWritesDone:
        // Read the answers left unread, then the status.
        if (!reading_ && !finishing_) {
          reading_ = true;
          stream_->Read(&response_, &read_tag_);
        }
        break;
      case Event::kRead:
        if (!ok) {
          reading_ = false;
          finishing_ = true;
          stream_->Finish(&status_, &finished_tag_);
          break;
        }
        if (obey_) {
          const absl::Duration asked = Kind::Interval(response_);
          if (asked > absl::ZeroDuration()) {
            every_.store(std::max<int64_t>(
                             1, absl::IDivDuration(asked + pacing_ / 2,
                                                   pacing_, &unused_)),
                         std::memory_order_relaxed);
          }
        }
        stream_->Read(&response_, &read_tag_);
        break;
      case Event::kFinished:
        if (!status_.ok()) FailLocked();
        done_ = true;
        break;
    }
  }

  void Close() override {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (!busy_) CloseLocked();
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    context_.TryCancel();  // what is in flight completes, not ok
  }
  bool Done() const override {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  bool failed() const override {
    absl::MutexLock lock(&mu_);
    return failed_ && !cancelled_;
  }
  std::string failure() const override {
    absl::MutexLock lock(&mu_);
    if (!done_ || status_.ok()) return "a write failed";
    return absl::StrCat("code ", status_.error_code(), ": ",
                        status_.error_message());
  }
  absl::Time failed_at() const override {
    absl::MutexLock lock(&mu_);
    return failed_at_;
  }

 private:
  void FailLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failed_) failed_at_ = absl::Now();
    failed_ = true;
  }
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    busy_ = true;
    stream_->WritesDone(&writes_done_tag_);
  }

  const absl::Duration pacing_;
  const bool obey_;
  absl::Duration unused_;  // IDivDuration's remainder
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<typename Kind::Request,
                                                typename Kind::Response>>
      stream_;
  Tag started_tag_{this, Event::kStarted};
  Tag written_tag_{this, Event::kWritten};
  Tag writes_done_tag_{this, Event::kWritesDone};
  Tag read_tag_{this, Event::kRead};
  Tag finished_tag_{this, Event::kFinished};
  mutable absl::Mutex mu_;
  typename Kind::Request request_ ABSL_GUARDED_BY(mu_);
  typename Kind::Response response_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a start or write in flight
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a read in flight
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // Finish() started
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time failed_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// Client completion queues, each drained by a thread.
class ClientQueues {
 public:
  explicit ClientQueues(int count) {
    for (int i = 0; i < count; ++i) {
      queues_.push_back(std::make_unique<grpc::CompletionQueue>());
      threads_.emplace_back([cq = queues_.back().get()] {
        pthread_setname_np(pthread_self(), "sim-client-cq");
        void* tag = nullptr;
        bool ok = false;
        while (cq->Next(&tag, &ok)) {
          auto* t = static_cast<Beater::Tag*>(tag);  // every tag is one
          t->beater->On(t->event, ok);
        }
      });
    }
  }
  ~ClientQueues() {
    for (auto& cq : queues_) cq->Shutdown();
    for (auto& t : threads_) t.join();
  }
  grpc::CompletionQueue* at(size_t i) { return queues_[i % queues_.size()].get(); }

 private:
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues_;
  std::vector<std::thread> threads_;
};

// CPU time this process (coordinator and simulated workers) used so far.
absl::Duration ProcessCpu() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return absl::DurationFromTimeval(usage.ru_utime) +
         absl::DurationFromTimeval(usage.ru_stime);
}

// What the witness's detection came to.
struct WitnessOutcome {
  // From rank 1's last heartbeat to its LOST; infinite when not seen.
  absl::Duration detection = absl::InfiniteDuration();
  // A member that kept heartbeating but was found LOST (the verdict ends
  // the round, so rank 1's can no longer come); -1 when none was.
  int false_lost_rank = -1;
  // The coordinator's reason for the LOST member found.
  std::string reason;
};

// How many members not ACTIVE at a level's check a level prints.
constexpr size_t kLostShown = 3;

struct LevelResult {
  int members = 0;
  std::string shed;  // "on" or "off"
  std::string police;  // "on" or "off"
  // What the coordinator's shedding came to at the end of the level.
  HeartbeatShedder::State shedding;
  int64_t shed_skips = 0;  // heartbeats not sent because it asked for fewer
  double cpu_cores = 0;  // CPU seconds per second during the measurement
  double offered = 0;
  double sent = 0;  // heartbeats the simulated workers got out, per second
  double accepted = 0;
  int64_t skipped = 0;
  int lost = 0;
  int stale = 0;
  // The coordinator's reasons for the first members not ACTIVE at the
  // check (at most kLostShown), each with its job and rank.
  std::vector<std::string> lost_reasons;
  int failed_streams = 0;
  // Streams whose half-close was not answered within 10 s (held behind the
  // messages they sent too fast), cancelled instead; not failures.
  int cancelled_at_close = 0;
  // Failed streams by what failed, and the first failure's time since the
  // load began to send.
  std::map<std::string, int> stream_failures;
  absl::Duration first_failure = absl::InfiniteDuration();
  // Streams ended with an error after the load stopped sending (its
  // members then silent, so LOST if the close takes long): not failures.
  int failed_after_stop = 0;
  // By kind of GetJob answer (--status_kinds), in flag order.
  struct StatusTiming {
    std::string kind;
    Percentiles latency;
    int queries = 0;
    size_t bytes = 0;
  };
  std::vector<StatusTiming> status;
  double rss_gib = 0;
  // An external coordinator's resident memory (bytes): before the joins,
  // after them, and at the end of the measured heartbeating.
  int64_t rss_before = 0;
  int64_t rss_joined = 0;
  int64_t rss_heartbeating = 0;
  // --witness: from the stopped member's last heartbeat to its LOST, and
  // the largest factor the coordinator asked of the witness's members.
  WitnessOutcome witness;
  int witness_factor = 1;
  absl::Duration witness_send_gap;
};

double RssGiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / (1024.0 * 1024.0);
}

// The coordinator a level runs against: in process, or an external
// gradsync-coordinator (--coordinator).
struct Target {
  std::string address;  // HOST:PORT
  Coordinator* in_process = nullptr;  // null for an external one
  int pid = 0;  // the external one's process id
};

// Job `job_id`'s status with every member, as GetJob answers it: from the
// in-process coordinator directly, or asked of the external one.
absl::StatusOr<v1::JobStatus> JobWithMembers(const Target& target,
                                             v1::Jobs::Stub* jobs,
                                             const std::string& job_id) {
  if (target.in_process != nullptr) {
    absl::StatusOr<v1::JobStatus> status =
        target.in_process->jobs().Get(job_id);
    if (status.ok()) target.in_process->health().Describe(&*status);
    return status;
  }
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  grpc::Status status = jobs->GetJob(&context, request, &response);
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  return std::move(*response.mutable_job());
}

// Waits until every one of `beaters` is done, or `limit` passed.
void AwaitDone(const std::vector<std::unique_ptr<Beater>>& beaters,
               absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  for (const auto& b : beaters) {
    while (!b->Done() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
}

// --witness: a job of 3 members beside the load, each on its own stream,
// heartbeating every `interval` (times what the coordinator asks) on a
// thread of its own until Stop(); StopRank1() silences rank 1 and returns
// when its last heartbeat was sent. Another job runs on other hosts: each
// member has a connection of its own (`channels`, one a member), and the
// witness runs in a process of its own (WitnessChildMain), whose gRPC
// threads do not serve the load's streams (in one process, gRPC's pollers
// serve every queue's connections, and the load's kept the witness's
// sends waiting for seconds).
class Witness {
 public:
  Witness(std::vector<std::shared_ptr<grpc::Channel>> channels,
          std::vector<v1::MemberRef> refs, absl::Duration interval)
      : interval_(interval), channels_(std::move(channels)), queues_(1) {
    for (size_t r = 0; r < refs.size(); ++r) {
      stubs_.push_back(v1::Monitor::NewStub(channels_[r % channels_.size()]));
      beaters_.push_back(std::make_unique<StreamBeater<MemberStream>>(
          stubs_.back().get(), queues_.at(0), std::vector{refs[r]}, interval,
          /*obey=*/true));
    }
    thread_ = std::thread([this] { Beat(); });
  }
  ~Witness() { Stop(); }

  absl::Time StopRank1() {
    absl::MutexLock lock(&mu_);
    rank1_stopped_ = true;
    return rank1_last_;
  }
  int factor() const {
    int most = 1;
    for (const auto& b : beaters_) most = std::max(most, b->every());
    return most;
  }
  // The longest a member still heartbeating went between two heartbeats
  // it got out (a write still in flight skips a beat): what this process,
  // not the coordinator, delayed.
  absl::Duration largest_send_gap() {
    absl::MutexLock lock(&mu_);
    return largest_gap_;
  }
  // Stops beating and closes the streams (at most 60 s).
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    thread_.join();
    for (auto& b : beaters_) b->Close();
    AwaitDone(beaters_, absl::Seconds(60));
    for (auto& b : beaters_) {
      if (!b->Done()) b.release();  // its operations still refer to it
    }
  }

 private:
  void Beat() {
    const absl::Time begin = absl::Now();
    for (int64_t cycle = 0;; ++cycle) {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline(absl::Condition(&stopping_),
                                begin + cycle * interval_)) {
        return;
      }
      last_sent_.resize(beaters_.size(), absl::InfinitePast());
      for (size_t r = 0; r < beaters_.size(); ++r) {
        if (r == 1 && rank1_stopped_) continue;
        if (cycle % beaters_[r]->every() != 0) continue;
        const absl::Time now = absl::Now();
        if (!beaters_[r]->Beat(cycle + 1, now)) continue;
        if (last_sent_[r] != absl::InfinitePast()) {
          largest_gap_ = std::max(largest_gap_, now - last_sent_[r]);
        }
        last_sent_[r] = now;
        if (r == 1) rank1_last_ = now;
      }
    }
  }

  const absl::Duration interval_;
  const std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Monitor::Stub>> stubs_;
  ClientQueues queues_;  // destroyed after the beaters that use it
  std::vector<std::unique_ptr<Beater>> beaters_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool rank1_stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time rank1_last_ ABSL_GUARDED_BY(mu_) = absl::Now();
  std::vector<absl::Time> last_sent_ ABSL_GUARDED_BY(mu_);
  absl::Duration largest_gap_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Waits (up to 120 s) until the coordinator shows the witness's rank 1,
// silent since `last`, LOST, or shows another member LOST.
WitnessOutcome WitnessDetection(const Target& target, v1::Jobs::Stub* jobs,
                                const std::string& job, absl::Time last) {
  WitnessOutcome outcome;
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  while (absl::Now() < give_up) {
    absl::StatusOr<v1::JobStatus> status = JobWithMembers(target, jobs, job);
    for (int r = 0; status.ok() && r < status->members_size(); ++r) {
      if (status->members(r).state() != v1::MEMBER_STATE_LOST) continue;
      outcome.reason = status->members(r).state_reason();
      if (r == 1) {
        outcome.detection = absl::Now() - last;
      } else {
        outcome.false_lost_rank = r;
      }
      return outcome;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return outcome;
}

// --witness_child: the witness job alone in this process, driven by the
// parent's WitnessProcess one line each way. Prints "ready" once its
// members joined and heartbeat; then "stop" silences rank 1 and is
// answered "stopped MICROS FACTOR" (when rank 1's last heartbeat was sent,
// Unix microseconds, and the largest factor asked of the witness), and
// "gap" is answered "gap MICROS" (Witness::largest_send_gap). It ends when
// its input closes.
int WitnessChildMain() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each answer at once
  const std::string address = absl::GetFlag(FLAGS_witness_child);
  std::vector<v1::MemberRef> refs =
      JoinJob(Connect(address, 1), absl::GetFlag(FLAGS_witness_job), 3);
  if (refs.empty()) return 1;
  const int members = static_cast<int>(refs.size());
  Witness witness(Connect(address, members), std::move(refs),
                  absl::Seconds(1) / absl::GetFlag(FLAGS_rate));
  std::printf("ready\n");
  char line[64];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    const absl::string_view command = absl::StripAsciiWhitespace(line);
    if (command == "stop") {
      const absl::Time last = witness.StopRank1();
      std::printf("stopped %lld %d\n",
                  static_cast<long long>(absl::ToUnixMicros(last)),
                  witness.factor());
    } else if (command == "gap") {
      std::printf("gap %lld\n", static_cast<long long>(absl::ToInt64Microseconds(
                                    witness.largest_send_gap())));
    } else {
      std::printf("unknown command '%s'\n", std::string(command).c_str());
    }
  }
  witness.Stop();
  return 0;
}

// The witness job in a child process of this binary (WitnessChildMain).
// Not thread-safe; the child is ended (and, if need be, killed) on
// destruction.
class WitnessProcess {
 public:
  // Starts it against `address` as job `job`, and waits (up to 120 s)
  // until its members joined and heartbeat.
  static absl::StatusOr<std::unique_ptr<WitnessProcess>> Start(
      const std::string& address, const std::string& job) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return absl::InternalError("cannot read /proc/self/exe");
    absl::StatusOr<std::unique_ptr<LineChild>> child = LineChild::Start(
        {std::string(self, n), absl::StrCat("--witness_child=", address),
         absl::StrCat("--witness_job=", job),
         absl::StrCat("--rate=", absl::GetFlag(FLAGS_rate))});
    if (!child.ok()) return child.status();
    auto process = std::unique_ptr<WitnessProcess>(
        new WitnessProcess(*std::move(child)));
    absl::StatusOr<std::string> ready =
        process->child_->Ask("", absl::Seconds(120));
    if (!ready.ok()) return ready.status();
    if (*ready != "ready") {
      return absl::InternalError(absl::StrCat("the witness said '", *ready,
                                              "' instead of 'ready'"));
    }
    return process;
  }
  ~WitnessProcess() { End().IgnoreError(); }  // a failure was reported

  // Silences rank 1: when its last heartbeat was sent, and the largest
  // factor the coordinator asked of the witness's members.
  absl::StatusOr<std::pair<absl::Time, int>> StopRank1() {
    absl::StatusOr<std::string> answer = child_->Ask("stop", absl::Seconds(10));
    if (!answer.ok()) return answer.status();
    int64_t micros = 0;
    int factor = 0;
    std::vector<absl::string_view> words = absl::StrSplit(*answer, ' ');
    if (words.size() != 3 || words[0] != "stopped" ||
        !absl::SimpleAtoi(words[1], &micros) ||
        !absl::SimpleAtoi(words[2], &factor)) {
      return absl::InternalError(
          absl::StrCat("the witness answered 'stop' with '", *answer, "'"));
    }
    return std::make_pair(absl::FromUnixMicros(micros), factor);
  }
  // The longest its members still heartbeating went between two sends.
  absl::StatusOr<absl::Duration> LargestSendGap() {
    absl::StatusOr<std::string> answer = child_->Ask("gap", absl::Seconds(10));
    if (!answer.ok()) return answer.status();
    int64_t micros = 0;
    absl::string_view value = *answer;
    if (!absl::ConsumePrefix(&value, "gap ") ||
        !absl::SimpleAtoi(value, &micros)) {
      return absl::InternalError(
          absl::StrCat("the witness answered 'gap' with '", *answer, "'"));
    }
    return absl::Microseconds(micros);
  }
  // Ends it: its streams close (it has 60 s to exit).
  absl::Status End() {
    if (ended_) return absl::OkStatus();
    ended_ = true;
    return child_->Close(absl::Seconds(70));
  }

 private:
  explicit WitnessProcess(std::unique_ptr<LineChild> child)
      : child_(std::move(child)) {}

  std::unique_ptr<LineChild> child_;
  bool ended_ = false;
};

LevelResult RunLevel(const Target& target, int members, int level_index) {
  LevelResult result;
  result.members = members;
  const bool obey = absl::GetFlag(FLAGS_obey_interval);
  const int job_size = std::min(members, absl::GetFlag(FLAGS_job_size));
  const double rate = absl::GetFlag(FLAGS_rate);
  auto channels = Connect(target.address, absl::GetFlag(FLAGS_channels));
  std::vector<std::unique_ptr<v1::Monitor::Stub>> stubs;
  for (const auto& c : channels) stubs.push_back(v1::Monitor::NewStub(c));
  auto jobs_stub = v1::Jobs::NewStub(channels[0]);
  const bool external = target.in_process == nullptr;

  // Rendezvous, then one stream per member, or per node of --nproc_per_node
  // members. A job's members are not monitored before their first
  // heartbeat, so every job joins before any stream opens.
  const int nproc = std::max(1, absl::GetFlag(FLAGS_nproc_per_node));
  const absl::Duration interval = absl::Seconds(1) / rate;
  if (external) result.rss_before = ResidentBytes(target.pid);
  std::vector<std::string> jobs;
  std::vector<std::vector<v1::MemberRef>> joined;
  for (int start = 0; start < members; start += job_size) {
    const std::string job = absl::StrCat("load", level_index, "-", jobs.size());
    joined.push_back(
        JoinJob(channels, job, std::min(job_size, members - start)));
    if (joined.back().empty()) {
      ++result.failed_streams;  // counted as a failure of the level
      return result;
    }
    jobs.push_back(job);
  }
  if (external) result.rss_joined = ResidentBytes(target.pid);
  // The witness joins and heartbeats before any stream of the load opens
  // (a level that fails here has nothing to close).
  std::unique_ptr<WitnessProcess> witness;
  const std::string witness_job = absl::StrCat("witness", level_index);
  if (absl::GetFlag(FLAGS_witness)) {
    absl::StatusOr<std::unique_ptr<WitnessProcess>> started =
        WitnessProcess::Start(target.address, witness_job);
    if (!started.ok()) {
      std::fprintf(stderr, "the witness: %s\n",
                   started.status().ToString().c_str());
      ++result.failed_streams;
      return result;
    }
    witness = *std::move(started);
  }
  // Leaked with any stream that never ends (its operations still use it).
  auto queues =
      std::make_unique<ClientQueues>(absl::GetFlag(FLAGS_client_queues));
  std::vector<std::unique_ptr<Beater>> beaters;
  for (std::vector<v1::MemberRef>& refs : joined) {
    for (size_t first = 0; first < refs.size(); first += nproc) {
      std::vector<v1::MemberRef> node(
          refs.begin() + first,
          refs.begin() + std::min(refs.size(), first + nproc));
      v1::Monitor::Stub* stub = stubs[beaters.size() % stubs.size()].get();
      grpc::CompletionQueue* cq = queues->at(beaters.size());
      if (nproc == 1) {
        beaters.push_back(std::make_unique<StreamBeater<MemberStream>>(
            stub, cq, std::move(node), interval, obey));
      } else {
        beaters.push_back(std::make_unique<StreamBeater<NodeStream>>(
            stub, cq, std::move(node), interval, obey));
      }
    }
  }


  // Pacers: each sends its slice's heartbeats spread evenly over every
  // interval, in 1 ms ticks; a stream asked for a longer interval sends on
  // every `every()`-th one.
  const absl::Duration warmup = 2 * interval;
  const absl::Duration measured = absl::GetFlag(FLAGS_duration);
  const int pacers = absl::GetFlag(FLAGS_pacers);
  std::atomic<int64_t> skipped{0};
  std::atomic<int64_t> shed_skips{0};
  std::atomic<int64_t> sent{0};
  std::atomic<bool> stop{false};
  const absl::Time begin = absl::Now();
  std::vector<std::thread> threads;
  for (int p = 0; p < pacers; ++p) {
    threads.emplace_back([&, p] {
      pthread_setname_np(pthread_self(), "sim-pacer");
      std::vector<Beater*> mine;
      for (size_t i = p; i < beaters.size(); i += pacers) {
        mine.push_back(beaters[i].get());
      }
      const int64_t ticks = std::max<int64_t>(1, interval / absl::Milliseconds(1));
      size_t next = 0;
      for (int64_t tick = 0; !stop.load(); ++tick) {
        const absl::Time due = begin + tick * absl::Milliseconds(1);
        const absl::Duration wait = due - absl::Now();
        if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
        const size_t until = mine.size() * ((tick % ticks) + 1) / ticks;
        const int64_t cycle = tick / ticks;
        const absl::Time ready = begin + cycle * interval;
        for (; next < until; ++next) {
          if (cycle % mine[next]->every() != 0) {
            shed_skips.fetch_add(nproc, std::memory_order_relaxed);
          } else if (mine[next]->Beat(cycle + 1, ready)) {
            sent.fetch_add(nproc, std::memory_order_relaxed);
          } else {
            skipped.fetch_add(nproc, std::memory_order_relaxed);
          }
        }
        if (until == mine.size()) next = 0;
      }
    });
  }

  // Warm up, then count what the coordinator accepts.
  absl::SleepFor(warmup);
  const int64_t skipped_before = skipped.load();
  const int64_t shed_before = shed_skips.load();
  const int64_t sent_before = sent.load();
  const int64_t accepted_before =
      external ? 0 : target.in_process->health().heartbeats();
  const absl::Duration cpu_before = ProcessCpu();
  const absl::Time measure_start = absl::Now();

  // Time status queries of a job of --status_members members meanwhile.
  if (absl::GetFlag(FLAGS_status_members) == members && !jobs.empty()) {
    std::vector<std::string> kinds =
        absl::StrSplit(absl::GetFlag(FLAGS_status_kinds), ',', absl::SkipEmpty());
    std::vector<std::vector<absl::Duration>> latencies(kinds.size());
    result.status.resize(kinds.size());
    const int queries = absl::GetFlag(FLAGS_status_queries);
    const absl::Duration spacing = measured / (queries + 1);
    for (int q = 0; q < queries && !kinds.empty(); ++q) {
      absl::SleepFor(spacing);
      const size_t k = q % kinds.size();
      if (kinds[k] == "metrics") {
        const absl::Time start = absl::Now();
        const std::string text = target.in_process->RenderMetrics();
        latencies[k].push_back(absl::Now() - start);
        result.status[k].bytes = text.size();
        continue;
      }
      v1::GetJobRequest request;
      request.set_job_id(jobs[q % jobs.size()]);
      if (kinds[k] == "summary") request.mutable_members()->set_none(true);
      if (kinds[k] == "page") {
        request.mutable_members()->set_unhealthy_only(true);
        request.mutable_members()->set_page_size(50);
      }
      // Parsed on an arena, as a client reading large statuses should.
      google::protobuf::Arena arena;
      auto* response =
          google::protobuf::Arena::CreateMessage<v1::GetJobResponse>(&arena);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(10));
      const absl::Time sent = absl::Now();
      grpc::Status status = jobs_stub->GetJob(&context, request, response);
      latencies[k].push_back(absl::Now() - sent);
      // Every member, none, or the unhealthy: none, all ACTIVE and in step.
      const int expected = kinds[k] == "full" ? job_size : 0;
      if (status.ok() && response->job().members_size() == expected &&
          response->job().summary().active() == job_size) {
        result.status[k].bytes = response->ByteSizeLong();
      } else {
        ++result.failed_streams;  // counted as a failure of the level
      }
    }
    for (size_t k = 0; k < kinds.size(); ++k) {
      result.status[k].kind = kinds[k];
      result.status[k].queries = static_cast<int>(latencies[k].size());
      result.status[k].latency = Summarize(std::move(latencies[k]));
    }
  }
  if (witness != nullptr) {
    // Half-way, once the shedding had time to settle.
    const absl::Duration half = measure_start + measured / 2 - absl::Now();
    if (half > absl::ZeroDuration()) absl::SleepFor(half);
    absl::StatusOr<std::pair<absl::Time, int>> stopped = witness->StopRank1();
    absl::StatusOr<absl::Duration> gap = absl::UnknownError("not stopped");
    if (stopped.ok()) {
      result.witness_factor = stopped->second;
      result.witness = WitnessDetection(target, jobs_stub.get(), witness_job,
                                        stopped->first);
      gap = witness->LargestSendGap();
    }
    if (gap.ok()) {
      result.witness_send_gap = *gap;
    } else {  // the level fails: no detection time
      const absl::Status why = stopped.ok() ? gap.status() : stopped.status();
      std::fprintf(stderr, "the witness: %s\n", why.ToString().c_str());
    }
  }
  const absl::Duration left = measure_start + measured - absl::Now();
  if (left > absl::ZeroDuration()) absl::SleepFor(left);
  const absl::Duration elapsed = absl::Now() - measure_start;
  if (external) result.rss_heartbeating = ResidentBytes(target.pid);
  result.cpu_cores = absl::FDivDuration(ProcessCpu() - cpu_before, elapsed);
  const int64_t accepted =
      external ? 0 : target.in_process->health().heartbeats() - accepted_before;
  result.skipped = skipped.load() - skipped_before;
  result.shed_skips = shed_skips.load() - shed_before;
  result.sent = (sent.load() - sent_before) / absl::ToDoubleSeconds(elapsed);
  result.offered = members * rate;
  result.accepted = accepted / absl::ToDoubleSeconds(elapsed);
  result.rss_gib = RssGiB();

  // Correctness while the load still runs: every member ACTIVE and heard
  // within 2 of the intervals the coordinator asks for now (an external
  // one's: the longest its answers asked of the workers).
  if (external) {
    for (const auto& b : beaters) {
      result.shedding.factor = std::max(result.shedding.factor, b->every());
    }
  } else {
    result.shedding = target.in_process->health().shedding();
  }
  const absl::Duration stale_after = 2 * interval * result.shedding.factor;
  const absl::Time now = absl::Now();
  for (const std::string& job : jobs) {
    absl::StatusOr<v1::JobStatus> status =
        JobWithMembers(target, jobs_stub.get(), job);
    if (!status.ok()) {
      result.lost += job_size;
      continue;
    }
    for (const v1::Member& m : status->members()) {
      if (m.state() != v1::MEMBER_STATE_ACTIVE) {
        ++result.lost;
        if (result.lost_reasons.size() < kLostShown) {
          result.lost_reasons.push_back(
              absl::StrCat("job '", job, "' rank ", m.rank(), " (",
                           v1::MemberState_Name(m.state()),
                           "): ", m.state_reason()));
        }
      }
      if (now - FromProtoTime(m.last_seen()) > stale_after) ++result.stale;
    }
  }
  stop.store(true);
  const absl::Time stopped = absl::Now();
  for (auto& t : threads) t.join();
  if (witness != nullptr) {
    if (absl::Status ended = witness->End(); !ended.ok()) {
      std::fprintf(stderr, "the witness: %s\n", ended.ToString().c_str());
      ++result.failed_streams;
    }
  }
  for (auto& b : beaters) b->Close();
  AwaitDone(beaters, absl::Seconds(10));
  for (auto& b : beaters) {
    if (b->Done()) continue;
    b->Cancel();
    ++result.cancelled_at_close;
  }
  AwaitDone(beaters, absl::Seconds(60));
  // A stream that failed after the load stopped was ended by its members'
  // silence since (found LOST, their round then over): not a failure.
  bool leaked = false;
  for (auto& b : beaters) {
    const bool failed = b->failed() && b->failed_at() < stopped;
    if (!b->Done() || failed) ++result.failed_streams;
    if (b->failed() && !failed) ++result.failed_after_stop;
    if (failed) {
      ++result.stream_failures[b->failure()];
      result.first_failure =
          std::min(result.first_failure, b->failed_at() - begin);
    }
    if (!b->Done()) {
      // Its operations still refer to it: keep it (leaked) rather than
      // destroy it under them.
      std::fprintf(stderr, "a stream did not end within 60 s of its cancel\n");
      b.release();
      leaked = true;
    }
  }
  if (leaked) queues.release();
  beaters.clear();
  return result;
}

std::string Ms(absl::Duration d) {
  return absl::StrFormat("%.2f", absl::ToDoubleMilliseconds(d));
}

// What keeps the flags from loading the external coordinator at `address`
// (--coordinator, --coordinator_pid) in `levels` levels and `modes`
// shedding modes; empty when nothing does.
std::string ExternalCoordinatorProblem(const std::string& address,
                                       size_t levels, size_t modes) {
  const int pid = absl::GetFlag(FLAGS_coordinator_pid);
  if (address.empty()) return "--coordinator_pid needs --coordinator";
  const absl::string_view host =
      absl::string_view(address).substr(0, address.rfind(':'));
  // The fault-injection harness's simulated hosts (tests/netns/lib.sh) are
  // namespaces the test made, on 10.77.0.0/24 (its switch) and 10.78.0.0/24
  // (its slow links).
  const bool harness = absl::GetFlag(FLAGS_netns_harness) &&
                       (absl::StartsWith(host, "10.77.0.") ||
                        absl::StartsWith(host, "10.78.0."));
  if (host != "localhost" && host != "[::1]" &&
      !absl::StartsWith(host, "127.") && !harness) {
    return absl::StrCat("--coordinator: '", address,
                        "' is not on the loopback interface (127.x.x.x, "
                        "localhost or [::1]), nor, with --netns_harness, a "
                        "simulated host of tests/netns (10.77.0.x, "
                        "10.78.0.x)");
  }
  if (pid <= 0) {
    return "--coordinator needs --coordinator_pid: its process id, to read "
           "its memory (/proc/PID/status)";
  }
  if (ResidentBytes(pid) == 0) {
    return absl::StrCat("--coordinator_pid: cannot read the memory of process ",
                        pid, " (/proc/", pid, "/status)");
  }
  if (levels != 1) {
    return "--coordinator: one --members level only (an external "
           "coordinator cannot be restarted between levels)";
  }
  if (modes != 1) {
    return "--coordinator: one --shed mode only, the one the coordinator "
           "runs with (its --shed_heartbeats)";
  }
  if (absl::GetFlag(FLAGS_max_heartbeat_rate) > 0) {
    return "--max_heartbeat_rate sets the in-process coordinator's cap; start "
           "gradsync-coordinator with --max_heartbeat_rate instead";
  }
  for (absl::string_view kind :
       absl::StrSplit(absl::GetFlag(FLAGS_status_kinds), ',')) {
    if (kind == "metrics") {
      return "--status_kinds: metrics renders /metrics in process, which "
             "needs the in-process coordinator (not with --coordinator)";
    }
  }
  return "";
}

int Main() {
  SetMinLogSeverity(absl::GetFlag(FLAGS_coordinator_logs) ? LogSeverity::kInfo
                                                         : LogSeverity::kError);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each result as it comes
  std::vector<int> levels;
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_members), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(text, &n) || n < 0 ||
        (n == 0 && !absl::GetFlag(FLAGS_witness))) {
      std::fprintf(stderr, "--members: '%s' is not a positive count (0 only "
                   "with --witness)\n", std::string(text).c_str());
      return 2;
    }
    levels.push_back(n);
  }
  std::vector<std::string> modes =
      absl::StrSplit(absl::GetFlag(FLAGS_shed), ',', absl::SkipEmpty());
  std::vector<std::string> policing =
      absl::StrSplit(absl::GetFlag(FLAGS_police), ',', absl::SkipEmpty());
  for (const auto& [flag, values] :
       {std::pair{"--shed", &modes}, std::pair{"--police", &policing}}) {
    for (const std::string& value : *values) {
      if (value != "on" && value != "off") {
        std::fprintf(stderr, "%s: '%s' is neither on nor off\n", flag,
                     value.c_str());
        return 2;
      }
    }
  }
  const double cap = absl::GetFlag(FLAGS_max_heartbeat_rate);
  const std::string external = absl::GetFlag(FLAGS_coordinator);
  const int external_pid = absl::GetFlag(FLAGS_coordinator_pid);
  if (!external.empty() || external_pid != 0) {
    const std::string problem =
        ExternalCoordinatorProblem(external, levels.size(),
                                   modes.size() * policing.size());
    if (!problem.empty()) {
      std::fprintf(stderr, "%s\n", problem.c_str());
      return 2;
    }
  }
  const std::string coordinator_text =
      external.empty()
          ? absl::StrFormat(
                "in-process coordinator (%d heartbeat queues%s)",
                absl::GetFlag(FLAGS_completion_queues),
                cap > 0 ? absl::StrFormat(", at most %.0f heartbeats/s", cap)
                        : "")
          : absl::StrFormat("gradsync-coordinator at %s (pid %d)", external,
                            external_pid);
  std::printf("heartbeat ingest: %s, %g Hz per member, %d connections, jobs "
              "of %d members, %s per level, shedding %s, holding back fast "
              "streams %s, workers %s the interval asked\n\n",
              coordinator_text.c_str(), absl::GetFlag(FLAGS_rate),
              absl::GetFlag(FLAGS_channels), absl::GetFlag(FLAGS_job_size),
              absl::FormatDuration(absl::GetFlag(FLAGS_duration)).c_str(),
              absl::GetFlag(FLAGS_shed).c_str(),
              absl::GetFlag(FLAGS_police).c_str(),
              absl::GetFlag(FLAGS_obey_interval) ? "obey" : "ignore");
  std::printf("%9s %4s %4s %10s %10s %10s %8s %8s %8s %6s %7s %8s %4s\n",
              "members", "shed", "hold", "offered/s", "sent/s", "accepted/s",
              "ratio", "skipped", "shed-skip", "#lost", "#stale", "#failed",
              "x");
  int failures = 0;
  int sustained = 0;
  int run = 0;
  // --witness: the detection time with the witness alone, by shed and
  // police mode.
  std::map<std::string, absl::Duration> baseline;
  std::vector<std::pair<std::string, std::string>> settings;
  for (const std::string& mode : modes) {
    for (const std::string& police : policing) {
      settings.emplace_back(mode, police);
    }
  }
  for (size_t i = 0; i < levels.size(); ++i) {
    for (const auto& [mode, police] : settings) {
      // A fresh coordinator per level and mode (unless an external one
      // serves): runs do not see each other's members or shedding state.
      Target target{external, nullptr, external_pid};
      std::unique_ptr<Coordinator> in_process;
      if (external.empty()) {
        CoordinatorConfig config;
        config.listen_address = "127.0.0.1:0";
        config.completion_queues = absl::GetFlag(FLAGS_completion_queues);
        // Tens of thousands of streams share --channels connections.
        config.max_streams_per_connection = 0;
        config.max_heartbeat_rate = cap;
        config.health.heartbeat_interval =
            absl::Seconds(1) / absl::GetFlag(FLAGS_rate);
        config.health.shedding.enabled = mode == "on";
        config.police_heartbeats = police == "on";
        config.grow_receive_windows = absl::GetFlag(FLAGS_grow_receive_windows);
        absl::StatusOr<MemoryLimit> memory_limit =
            ParseMemoryLimit(absl::GetFlag(FLAGS_transport_memory_limit));
        if (!memory_limit.ok()) {
          std::fprintf(stderr, "--transport_memory_limit: %s\n",
                       memory_limit.status().ToString().c_str());
          return 1;
        }
        config.transport_memory_limit = memory_limit->bytes;
        in_process = std::make_unique<Coordinator>(config);
        absl::Status started = in_process->Start();
        if (!started.ok()) {
          std::fprintf(stderr, "cannot start the coordinator: %s\n",
                       started.ToString().c_str());
          return 1;
        }
        target = {absl::StrCat("127.0.0.1:", in_process->port()),
                  in_process.get(), 0};
      }
      LevelResult r = RunLevel(target, levels[i], run++);
      if (in_process != nullptr) in_process->Shutdown();
      r.shed = mode;
      r.police = police;
      const double ratio = r.offered > 0 ? r.accepted / r.offered : 0;
      const bool ok = r.lost == 0 && r.stale == 0 && r.failed_streams == 0;
      // Sustained: every member live and (almost) all offered heartbeats
      // accepted; the simulated workers share the 2 cores and may fall
      // short. A level that needed shedding is not sustained.
      if (ok && ratio >= 0.95) sustained = std::max(sustained, r.members);
      failures += ok ? 0 : 1;
      // An external coordinator counts the heartbeats it accepted for
      // itself only.
      const std::string accepted =
          external.empty() ? absl::StrFormat("%.0f", r.accepted) : "-";
      const std::string accepted_ratio =
          external.empty() ? absl::StrFormat("%.3f", ratio) : "-";
      std::printf("%9d %4s %4s %10.0f %10.0f %10s %8s %8lld %8lld %6d %7d "
                  "%8d %4d\n",
                  r.members, r.shed.c_str(), r.police.c_str(), r.offered,
                  r.sent,
                  accepted.c_str(), accepted_ratio.c_str(),
                  static_cast<long long>(r.skipped),
                  static_cast<long long>(r.shed_skips), r.lost, r.stale,
                  r.failed_streams, r.shedding.factor);
      for (const std::string& reason : r.lost_reasons) {
        std::printf("  not active: %s\n", reason.c_str());
      }
      if (!r.stream_failures.empty()) {
        std::printf("  failed streams, the first %s after the load began:\n",
                    absl::FormatDuration(r.first_failure).c_str());
        std::vector<std::pair<int, std::string>> kinds;
        for (const auto& [failure, count] : r.stream_failures) {
          kinds.emplace_back(count, failure);
        }
        std::sort(kinds.rbegin(), kinds.rend());  // the most common first
        for (size_t k = 0; k < kinds.size() && k < 5; ++k) {
          std::printf("    %d x %s\n", kinds[k].first, kinds[k].second.c_str());
        }
        if (kinds.size() > 5) {
          std::printf("    and %zu other kinds\n", kinds.size() - 5);
        }
      }
      for (const LevelResult::StatusTiming& t : r.status) {
        const std::string what =
            t.kind == "metrics" ? "/metrics" : "GetJob " + t.kind;
        std::printf("  %-15s p50 %s ms, p99 %s ms, max %s ms (%d "
                    "queries, %zu bytes)\n",
                    what.c_str(), Ms(t.latency.p50).c_str(),
                    Ms(t.latency.p99).c_str(), Ms(t.latency.max).c_str(),
                    t.queries, t.bytes);
      }
      // Growth of the external coordinator's memory over its memory before
      // the joins, per member.
      const double joined_bytes =
          static_cast<double>(r.rss_joined - r.rss_before) / r.members;
      const double heartbeating_bytes =
          static_cast<double>(r.rss_heartbeating - r.rss_before) / r.members;
      if (!external.empty()) {
        std::printf("  coordinator memory: %.1f MiB before the joins; per "
                    "member %.0f bytes joined, %.0f bytes heartbeating\n",
                    r.rss_before / (1024.0 * 1024.0), joined_bytes,
                    heartbeating_bytes);
      }
      std::string line = absl::StrFormat(
          "RESULT members=%d nproc_per_node=%d shed=%s police=%s offered=%.0f "
          "sent=%.0f",
          r.members, absl::GetFlag(FLAGS_nproc_per_node), r.shed, r.police,
          r.offered, r.sent);
      if (external.empty()) absl::StrAppendFormat(&line, " accepted=%.0f", r.accepted);
      absl::StrAppendFormat(&line,
                            " lost=%d stale=%d failed=%d "
                            "cancelled_at_close=%d failed_after_stop=%d "
                            "factor=%d",
                            r.lost, r.stale, r.failed_streams,
                            r.cancelled_at_close, r.failed_after_stop,
                            r.shedding.factor);
      if (external.empty()) {
        absl::StrAppendFormat(
            &line,
            " shed_periods=%d late_ratio=%.3f capacity=%.0f cpu_cores=%.2f "
            "cpu_us_per_heartbeat=%.1f max_rss_gib=%.2f",
            r.shedding.shed_periods, r.shedding.late_fraction,
            r.shedding.capacity, r.cpu_cores,
            r.accepted > 0 ? 1e6 * r.cpu_cores / r.accepted : 0, r.rss_gib);
      } else {
        absl::StrAppendFormat(&line,
                              " rss_before_bytes=%d "
                              "rss_bytes_per_member_joined=%.0f "
                              "rss_bytes_per_member_heartbeating=%.0f",
                              r.rss_before, joined_bytes, heartbeating_bytes);
      }
      for (const LevelResult::StatusTiming& t : r.status) {
        absl::StrAppend(&line, " status_", t.kind, "_p99_ms=",
                        Ms(t.latency.p99));
      }
      if (absl::GetFlag(FLAGS_witness)) {
        const absl::Duration detection = r.witness.detection;
        const bool found = detection != absl::InfiniteDuration();
        const bool healthy_lost = r.witness.false_lost_rank >= 0;
        if (!found) ++failures;
        if (healthy_lost) {
          std::printf("  witness job (3 members): rank %d, still "
                      "heartbeating, was found LOST first (the round ended "
                      "before rank 1's silence could be timed)\n",
                      r.witness.false_lost_rank);
        } else {
          std::printf("  witness job (3 members): rank 1 found LOST %s after "
                      "its last heartbeat; its members asked for %dx the "
                      "interval\n",
                      found ? absl::FormatDuration(detection).c_str()
                            : "not within 120 s",
                      r.witness_factor);
        }
        if (!r.witness.reason.empty()) {
          std::printf("  witness job: the coordinator's reason: %s\n",
                      r.witness.reason.c_str());
        }
        std::printf("  witness job: the longest its members went between two "
                    "heartbeats sent: %s\n",
                    absl::FormatDuration(r.witness_send_gap).c_str());
        absl::StrAppendFormat(
            &line, " witness_detection_ms=%s witness_factor=%d "
            "witness_healthy_lost=%d witness_send_gap_ms=%s",
            found ? Ms(detection) : "-", r.witness_factor, healthy_lost ? 1 : 0,
            Ms(r.witness_send_gap));
        const std::string key = r.shed + "/" + r.police;
        if (r.members == 0) baseline[key] = detection;
        if (r.members > 0 && found && baseline.count(key) > 0) {
          std::printf("  witness detection / with the witness alone: %.2f\n",
                      absl::FDivDuration(detection, baseline[key]));
        }
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }
  if (external.empty()) {
    std::printf("\nhighest sustained (every member live, >= 95%% of the "
                "offered heartbeats accepted): %d members = %d heartbeats/s\n",
                sustained,
                static_cast<int>(sustained * absl::GetFlag(FLAGS_rate)));
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As in the coordinator's main(): Debian's abseil checks every mutex
  // acquisition for lock-order cycles, which the service does not need.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A witness child that died must fail its level, not end this process.
  signal(SIGPIPE, SIG_IGN);
  if (!absl::GetFlag(FLAGS_witness_child).empty()) {
    gradsync::SetMinLogSeverity(gradsync::LogSeverity::kError);
    return gradsync::WitnessChildMain();
  }
  return gradsync::Main();
}
