// gradsync-sim-worker: a stand-in worker that joins a job and bootstraps
// through the coordinator's key-value store exactly as a real backend does
// (every rank publishes its address, rank 0 publishes a communicator id, all
// ranks meet at a barrier), then prints its assignment and exits 0.
//
// With --train_steps=N it then simulates training with heartbeats (a
// HealthReporter): every step issues --buckets all-reduces (fingerprinted,
// numbered from 1), reports step metrics and when its first bucket was ready,
// and at the end reports completion. --lag makes this rank a straggler,
// --desync_at makes it issue a different collective, --fail_at_step makes it
// fail: the knobs the failure-detection tests turn.
//
//   gradsync-sim-worker --coordinator=HOST:PORT --job=NAME --nnodes=MIN[:MAX]
//       [--train_steps=N --step_time=100ms --lag=0s --desync_at=0 ...]
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "common/leader_term.h"
#include "common/logging.h"
#include "common/mutex_checks.h"
#include "common/token_file.h"
#include "common/status_macros.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/runtime/health_reporter.h"
#include "worker/runtime/join.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the coordinator's TLS certificate (empty: "
          "plaintext)");
ABSL_FLAG(std::string, tls_cert, "",
          "with --tls_ca: this client's PEM certificate, for a coordinator "
          "that requires one (--tls_client_ca)");
ABSL_FLAG(std::string, tls_key, "", "the PEM private key of --tls_cert");
ABSL_FLAG(std::string, token_file, "",
          "a file holding this job's token, for a coordinator with "
          "--auth=token (default: $GRADSYNC_TOKEN)");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:29400",
          "the coordinator, HOST:PORT; or its replicas (--etcd), "
          "HOST:PORT,HOST:PORT,... (names in a list are resolved to their "
          "IPv4 addresses once, at start)");
ABSL_FLAG(std::string, job, "", "job id (created by the first join)");
ABSL_FLAG(std::string, nnodes, "1", "nodes per round: N or MIN:MAX");
ABSL_FLAG(int, nproc_per_node, 1, "worker processes per node");
ABSL_FLAG(std::string, node_id, "",
          "groups this process with others on the same node (default: "
          "hostname)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda (cuda claims NCCL)");
ABSL_FLAG(std::string, backend, "auto", "auto, gloo or nccl");
ABSL_FLAG(absl::Duration, join_timeout, absl::Minutes(10),
          "how long to wait for the round to close");
ABSL_FLAG(absl::Duration, last_call_timeout, absl::Seconds(30),
          "once MIN nodes joined, how long the round waits for more");
ABSL_FLAG(absl::Duration, bootstrap_timeout, absl::Minutes(2),
          "how long the key-value bootstrap waits for the other ranks");
ABSL_FLAG(int64_t, train_steps, 0,
          "after the bootstrap, simulate this many training steps with "
          "heartbeats, then report completion (0: exit after the bootstrap)");
ABSL_FLAG(absl::Duration, step_time, absl::Milliseconds(100),
          "wall time of one simulated step");
ABSL_FLAG(int, buckets, 2, "all-reduces (gradient buckets) per step");
ABSL_FLAG(absl::Duration, lag, absl::ZeroDuration(),
          "report this rank's first gradient bucket ready this much later "
          "than the others' (a straggler)");
ABSL_FLAG(int64_t, desync_at, 0,
          "issue a collective of a different size at this sequence number "
          "(a desync); 0: never");
ABSL_FLAG(int64_t, fail_at_step, 0,
          "report failure (exit code 3) at this step; 0: never");
ABSL_FLAG(bool, kv_checks, false,
          "with --train_steps: every step also stores a key of its own in the "
          "round's key-value store, and at the end every write the "
          "coordinator acknowledged is read back (the newest also every half "
          "step meanwhile); one missing or changed fails the run (exit 1): "
          "the fault scenarios' check that no acknowledged write is lost. "
          "Prints the term of every answer that names one ('kv ack: ...', "
          "tests/netns/check_terms.py)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::ZeroDuration(),
          "the job's heartbeat interval (0: the coordinator's default)");

namespace gradsync {
namespace {

absl::StatusOr<v1::JoinRequest> BuildRequestFromFlags() {
  JoinConfig config;
  config.job_id = absl::GetFlag(FLAGS_job);
  config.nnodes = absl::GetFlag(FLAGS_nnodes);
  config.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  config.node_id = absl::GetFlag(FLAGS_node_id);
  config.backend = absl::GetFlag(FLAGS_backend);
  config.join_timeout = absl::GetFlag(FLAGS_join_timeout);
  config.last_call_timeout = absl::GetFlag(FLAGS_last_call_timeout);
  config.address = "127.0.0.1";
  // A simulated worker claims what --device says without probing it.
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cuda") {
    config.device_type = v1::DEVICE_TYPE_CUDA;
    config.device_count = 1;
    config.nccl_available = true;
  } else if (device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got '", device, "'"));
  }
  GS_ASSIGN_OR_RETURN(v1::JoinRequest request, BuildJoinRequest(config));
  const absl::Duration interval = absl::GetFlag(FLAGS_heartbeat_interval);
  if (interval > absl::ZeroDuration()) {
    *request.mutable_config()->mutable_heartbeat_interval() =
        ToProtoDuration(interval);
  }
  return request;
}

// The bootstrap a real backend performs through the store.
absl::Status Bootstrap(CoordinatorClient& client, const v1::Assignment& a,
                       const v1::NodeDescriptor& node) {
  v1::Scope scope;
  scope.set_job_id(a.job_id());
  scope.set_round(a.round());
  const absl::Duration timeout = absl::GetFlag(FLAGS_bootstrap_timeout);
  GS_RETURN_IF_ERROR(client.Set(
      scope, absl::StrCat("addr/", a.rank()),
      absl::StrCat(node.addresses(0), " pid ", node.pid())));
  if (a.rank() == 0) {
    GS_RETURN_IF_ERROR(client.Set(scope, "comm_id", NewRandomId()));
  }
  std::vector<std::string> keys = {"comm_id"};
  for (int r = 0; r < a.world_size(); ++r) {
    keys.push_back(absl::StrCat("addr/", r));
  }
  GS_RETURN_IF_ERROR(client.Wait(scope, keys, timeout));
  GS_ASSIGN_OR_RETURN(std::string comm_id, client.Get(scope, "comm_id"));
  // A barrier of one key per rank: each rank's arrival is a key of its
  // own, which the barrier waits for by name.
  GS_RETURN_IF_ERROR(
      client.Set(scope, absl::StrCat("barrier/", a.rank()), "arrived"));
  std::vector<std::string> arrived;
  for (int r = 0; r < a.world_size(); ++r) {
    arrived.push_back(absl::StrCat("barrier/", r));
  }
  GS_RETURN_IF_ERROR(client.Wait(scope, arrived, timeout));
  std::printf(
      "rank %d/%d (local %d/%d, node %d/%d) round %lld backend %s: "
      "bootstrapped communicator %s\n",
      a.rank(), a.world_size(), a.local_rank(), a.local_world_size(),
      a.node_rank(), a.num_nodes(), static_cast<long long>(a.round()),
      BackendName(a.backend()).c_str(), comm_id.substr(0, 8).c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

// Rank 0's clock when round `a` starts, shared through the store.
absl::StatusOr<absl::Time> SharedStart(CoordinatorClient& client,
                                       const v1::Assignment& a) {
  v1::Scope scope;
  scope.set_job_id(a.job_id());
  scope.set_round(a.round());
  if (a.rank() == 0) {
    GS_RETURN_IF_ERROR(client.Set(
        scope, "t0", absl::StrCat(absl::ToUnixNanos(absl::Now()))));
  }
  GS_RETURN_IF_ERROR(
      client.Wait(scope, {"t0"}, absl::GetFlag(FLAGS_bootstrap_timeout)));
  GS_ASSIGN_OR_RETURN(std::string t0_text, client.Get(scope, "t0"));
  int64_t t0_nanos = 0;
  if (!absl::SimpleAtoi(t0_text, &t0_nanos)) {
    return absl::InternalError("rank 0 stored a malformed t0");
  }
  return absl::FromUnixNanos(t0_nanos);
}

// What a trainer's heartbeat says after step `step` (started at `start`):
// its first bucket ready at mid-step (plus --lag), one all-reduce per
// bucket (numbered on from `*sequence`; --desync_at makes one differ).
v1::WorkerMetrics StepMetrics(int64_t step, absl::Time start,
                              absl::Duration step_time, int64_t* sequence) {
  v1::WorkerMetrics m;
  m.set_state(v1::WORKER_STATE_TRAINING);
  v1::StepReady* ready = m.add_first_bucket_ready();
  ready->set_step(step);
  *ready->mutable_time() =
      ToProtoTime(start + step_time / 2 + absl::GetFlag(FLAGS_lag));
  for (int b = 0; b < absl::GetFlag(FLAGS_buckets); ++b) {
    v1::CollectiveFingerprint* f = m.add_recent_collectives();
    f->set_sequence(++*sequence);
    f->set_op("allreduce");
    f->set_dtype("float32");
    f->set_count(int64_t{1024} << b);
    f->set_bucket_index(b);
    if (*sequence == absl::GetFlag(FLAGS_desync_at)) {
      f->set_count(f->count() + 1);
    }
  }
  m.set_last_started_collective(*sequence);
  m.set_last_finished_collective(*sequence);
  m.set_step(step);
  m.set_samples_per_second(32 / absl::ToDoubleSeconds(step_time));
  m.mutable_step_timings()->set_step_seconds(absl::ToDoubleSeconds(step_time));
  m.mutable_step_timings()->set_communication_seconds(
      absl::ToDoubleSeconds(step_time) / 10);
  return m;
}

// --kv_checks: one key-value write per step, remembered when the coordinator
// acknowledged it, and a reader that reads the newest acknowledged one back
// every half step meanwhile (reads a replica answers while it should no
// longer lead would show in their terms); Verify reads them all back at
// the end. (Each answer's term is printed by KvAckPrinter.)
class KvChecks {
 public:
  KvChecks(CoordinatorClient* client, const v1::Assignment& a,
           absl::Duration step_time)
      : client_(client) {
    scope_.set_job_id(a.job_id());
    scope_.set_round(a.round());
    prefix_ = absl::StrCat("check/", a.rank(), "/");
    reader_ = std::thread([this, step_time] { ReadLoop(step_time / 2); });
  }
  ~KvChecks() { StopReading(); }

  void Write(int64_t step) {
    const std::string value = absl::StrCat("step ", step);
    absl::Status status = client_->Set(scope_, Key(step), value);
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      acked_.push_back(step);
    } else {
      ++refused_;
      GS_LOG(WARNING) << "kv check: write of step " << step
                      << " not acknowledged: " << status;
    }
  }

  // DATA_LOSS naming the first lost write when any acknowledged one is
  // missing or changed, here or to the reader.
  absl::Status Verify() {
    StopReading();
    absl::MutexLock lock(&mu_);
    for (int64_t step : acked_) {
      absl::StatusOr<std::string> got = client_->Get(scope_, Key(step));
      if (got.ok() && *got == absl::StrCat("step ", step)) continue;
      LostLocked(step, got);
    }
    std::printf("kv checks: %zu writes acknowledged, %lld not, %lld lost "
                "(and %lld reads meanwhile)\n",
                acked_.size(), static_cast<long long>(refused_),
                static_cast<long long>(lost_), static_cast<long long>(reads_));
    std::fflush(stdout);
    if (lost_ == 0) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(
        lost_, " acknowledged key-value write(s) lost, first ", first_lost_));
  }

 private:
  std::string Key(int64_t step) const { return absl::StrCat(prefix_, step); }

  void LostLocked(int64_t step, const absl::StatusOr<std::string>& got)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++lost_;
    if (first_lost_.empty()) {
      first_lost_ = absl::StrCat(Key(step), ": ",
                                 got.ok() ? *got : got.status().ToString());
    }
  }

  // Reads the newest acknowledged write back every `period` until stopped;
  // a read the coordinator refuses (a failover) is not a loss.
  void ReadLoop(absl::Duration period) {
    while (!stop_.WaitForNotificationWithTimeout(period)) {
      int64_t step = 0;
      {
        absl::MutexLock lock(&mu_);
        if (acked_.empty()) continue;
        step = acked_.back();
      }
      absl::StatusOr<std::string> got = client_->Get(scope_, Key(step));
      absl::MutexLock lock(&mu_);
      ++reads_;
      if (got.ok() && *got != absl::StrCat("step ", step)) LostLocked(step, got);
      if (absl::IsNotFound(got.status())) LostLocked(step, got);
    }
  }

  void StopReading() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (reader_.joinable()) reader_.join();
  }

  CoordinatorClient* const client_;
  v1::Scope scope_;
  std::string prefix_;
  absl::Mutex mu_;
  std::vector<int64_t> acked_ ABSL_GUARDED_BY(mu_);
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lost_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_lost_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread reader_;
};

// With --kv_checks: prints the term of every key-value answer that names
// one ("kv ack: get term 7 at 1764254321123456"), for
// tests/netns/check_terms.py.
void KvAckPrinter(const char* what, const TermStamp& stamp) {
  const absl::string_view call(what);
  if (call != "set" && call != "get") return;
  std::printf("kv ack: %s term %lld at %lld\n", what,
              static_cast<long long>(stamp.term),
              static_cast<long long>(absl::ToUnixMicros(stamp.answered_at)));
  std::fflush(stdout);
}

// The training loop a real trainer runs, with its collectives and compute
// simulated: step s starts at t0 + (s - 1) * step_time on every rank (t0 is
// rank 0's clock, shared through the store), so first-bucket-ready times
// line up across ranks except for --lag.
absl::Status Train(CoordinatorClient& client, const v1::Assignment& a,
                   const v1::NodeDescriptor& node) {
  GS_ASSIGN_OR_RETURN(const absl::Time t0, SharedStart(client, a));
  const absl::Duration step_time = absl::GetFlag(FLAGS_step_time);
  HealthReporter reporter(&client);
  reporter.Start(a, node.incarnation_id());
  int64_t sequence = 0;
  const int64_t steps = absl::GetFlag(FLAGS_train_steps);
  std::optional<KvChecks> checks;
  if (absl::GetFlag(FLAGS_kv_checks)) checks.emplace(&client, a, step_time);
  for (int64_t step = 1; step <= steps; ++step) {
    reporter.Update(
        StepMetrics(step, t0 + (step - 1) * step_time, step_time, &sequence));
    if (checks.has_value()) checks->Write(step);
    if (step == absl::GetFlag(FLAGS_fail_at_step)) {
      GS_RETURN_IF_ERROR(reporter.Finish(
          false, 3, absl::StrCat("simulated failure at step ", step)));
      return absl::AbortedError(absl::StrCat("failed at step ", step));
    }
    const HealthReporter::Verdict verdict = reporter.verdict();
    if (verdict.state == v1::JOB_STATE_FAILED) {
      reporter.Stop();
      return absl::AbortedError(
          absl::StrCat("the coordinator failed the job: ", verdict.reason));
    }
    absl::SleepFor(t0 + step * step_time - absl::Now());  // the "compute"
  }
  if (checks.has_value()) {
    absl::Status verified = checks->Verify();
    if (!verified.ok()) {
      GS_RETURN_IF_ERROR(reporter.Finish(false, 1, verified.ToString()));
      return verified;
    }
  }
  GS_RETURN_IF_ERROR(reporter.Finish(true, 0, ""));
  std::printf("rank %d: trained %lld steps\n", a.rank(),
              static_cast<long long>(steps));
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Run() {
  GS_ASSIGN_OR_RETURN(v1::JoinRequest request, BuildRequestFromFlags());
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_coordinator);
  options.tls = {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                 absl::GetFlag(FLAGS_tls_key)};
  GS_ASSIGN_OR_RETURN(options.token,
                      ClientToken(absl::GetFlag(FLAGS_token_file)));
  if (absl::GetFlag(FLAGS_kv_checks)) options.on_term = KvAckPrinter;
  GS_ASSIGN_OR_RETURN(auto client, GrpcCoordinatorClient::Create(options));
  GS_ASSIGN_OR_RETURN(v1::Assignment assignment, client->Join(request));
  GS_RETURN_IF_ERROR(Bootstrap(*client, assignment, request.node()));
  if (absl::GetFlag(FLAGS_train_steps) <= 0) return absl::OkStatus();
  return Train(*client, assignment, request.node());
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  gradsync::ConfigureMutexChecks();
  absl::SetProgramUsageMessage(
      "gradsync-sim-worker --coordinator=HOST:PORT --job=NAME "
      "--nnodes=MIN[:MAX]");
  absl::ParseCommandLine(argc, argv);
  absl::Status status = gradsync::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "gradsync-sim-worker: %s\n",
                 std::string(status.message()).c_str());
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
