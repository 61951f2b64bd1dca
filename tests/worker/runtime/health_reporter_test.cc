#include "worker/runtime/health_reporter.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/error_text.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/storage/in_memory_storage.h"
#include "tests/testing/eventually.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kPromptly = absl::Seconds(10);

HealthReporterOptions FastOptions() {
  HealthReporterOptions options;
  options.interval = absl::Milliseconds(50);
  options.initial_backoff = absl::Milliseconds(10);
  options.max_backoff = absl::Milliseconds(100);
  return options;
}

// A coordinator on a loopback port (real clock; heartbeats every 100 ms) and
// one worker that joined job "train".
class HealthReporterTest : public ::testing::Test {
 protected:
  // On `port` (0: any free one), keeping its state in `storage` when given.
  void StartCoordinator(int port = 0, Storage* storage = nullptr) {
    CoordinatorConfig config;
    config.storage = storage;
    config.listen_address = absl::StrCat("127.0.0.1:", port);
    config.poll_interval = absl::Milliseconds(5);
    config.health.heartbeat_interval = absl::Milliseconds(100);
    config.health.missed_heartbeats = 50;  // no loss from a slow test machine
    coordinator_ = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator_->Start().ok());
    port_ = coordinator_->port();
  }

  std::unique_ptr<CoordinatorClient> Client(int port) {
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", port);
    return *GrpcCoordinatorClient::Create(options);
  }

  // Joins one worker with incarnation `incarnation`, as process `pid`
  // (0: this one).
  v1::Assignment JoinOne(const std::string& incarnation, int64_t pid = 0) {
    v1::JoinRequest request;
    request.set_job_id("train");
    request.mutable_config()->set_job_id("train");
    request.mutable_config()->set_min_nodes(1);
    *request.mutable_node() = LocalNodeDescriptor();
    request.mutable_node()->set_incarnation_id(incarnation);
    if (pid != 0) request.mutable_node()->set_pid(pid);
    absl::StatusOr<v1::Assignment> a = Client(port_)->Join(request);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : v1::Assignment();
  }

  v1::JobStatus Job() {
    absl::StatusOr<v1::JobStatus> job = Client(port_)->GetJob("train");
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::JobStatus();
  }

  InMemoryStorage storage_;  // for tests that restart the coordinator
  std::unique_ptr<Coordinator> coordinator_;
  int port_ = 0;
};

v1::WorkerMetrics Step(int64_t step) {
  v1::WorkerMetrics m;
  m.set_state(v1::WORKER_STATE_TRAINING);
  m.set_step(step);
  return m;
}

TEST_F(HealthReporterTest, RoundOverIsReportedWhenTheRoundIsSuperseded) {
  StartCoordinator();
  v1::Assignment a = JoinOne("inc-a");
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  absl::Notification over;
  absl::Status why;
  int calls = 0;
  reporter.Start(a, "inc-a", [&](const absl::Status& status) {
    why = status;
    ++calls;
    over.Notify();
  });
  ASSERT_TRUE(Eventually([&] { return reporter.stats().answers > 0; }));
  // A new process on the same node supersedes round 1 (and forms round 2).
  JoinOne("inc-b");
  ASSERT_TRUE(over.WaitForNotificationWithTimeout(kPromptly));
  EXPECT_EQ(why.code(), absl::StatusCode::kAborted) << why;
  reporter.Stop();
  EXPECT_EQ(calls, 1);
}

TEST_F(HealthReporterTest, StartAfterStopSendsHeartbeatsAgain) {
  StartCoordinator();
  v1::Assignment a = JoinOne("inc-a");
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(a, "inc-a");
  ASSERT_TRUE(Eventually([&] { return reporter.stats().answers > 0; }));
  reporter.Stop();  // as Finish() does before its completion report
  // Round 2 forms (a new process on the node); the reporter starts again
  // for it, as after a rejoin.
  v1::Assignment b = JoinOne("inc-b");
  reporter.Start(b, "inc-b");
  reporter.Update(Step(3));
  ASSERT_TRUE(Eventually([&] { return Job().members(0).metrics().step() == 3; }));
  EXPECT_EQ(Job().round(), 2);
}

TEST_F(HealthReporterTest, ANewRoundsHeartbeatsCarryNothingOfTheRoundBefore) {
  StartCoordinator();
  v1::Assignment a = JoinOne("inc-a");
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(a, "inc-a");
  v1::WorkerMetrics failed = Step(7);
  failed.set_last_error("round 1's collective failed");
  failed.mutable_round_start()->mutable_state_transfer()->set_seconds(1);
  reporter.Update(failed);
  ASSERT_TRUE(
      Eventually([&] { return Job().members(0).metrics().step() == 7; }));
  // Rejoined in round 2 (a new process on the node forms it), with no
  // Update yet: the process group of the new round is still being built.
  v1::Assignment b = JoinOne("inc-b");
  reporter.Start(b, "inc-b");
  ASSERT_TRUE(Eventually([&] {
    const v1::JobStatus job = Job();
    return job.round() == 2 && job.members_size() == 1 &&
           job.members(0).metrics().state() == v1::WORKER_STATE_STARTING;
  }));
  const v1::WorkerMetrics shown = Job().members(0).metrics();
  EXPECT_EQ(shown.step(), 0);
  EXPECT_EQ(shown.last_error(), "");
  EXPECT_FALSE(shown.has_round_start());
  reporter.Stop();
}

TEST_F(HealthReporterTest, HeartbeatsNameTheReportingProcessUnlessToldAnother) {
  StartCoordinator();
  // The member was joined by another process (a launcher for its
  // process), pid 1.
  const v1::Assignment a = JoinOne("inc-a", /*pid=*/1);
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(a, "inc-a");
  reporter.Update(Step(2));
  ASSERT_TRUE(Eventually([&] {
    const v1::JobStatus job = Job();
    return job.members(0).metrics().step() == 2 &&
           job.members(0).node().pid() == getpid();
  }));
  // A node agent heartbeating for a process it started names it.
  v1::WorkerMetrics child = Step(3);
  child.set_pid(4242);
  reporter.Update(child);
  ASSERT_TRUE(
      Eventually([&] { return Job().members(0).node().pid() == 4242; }));
  reporter.Stop();
}

TEST_F(HealthReporterTest, UpdatesReachTheCoordinatorAndItsVerdictComesBack) {
  StartCoordinator();
  v1::Assignment a = JoinOne("inc-a");
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  EXPECT_EQ(reporter.verdict().state, v1::JOB_STATE_UNSPECIFIED);
  reporter.Start(a, "inc-a");
  reporter.Update(Step(7));
  ASSERT_TRUE(Eventually([&] { return Job().members(0).metrics().step() == 7; }));
  reporter.Update(Step(8));
  ASSERT_TRUE(Eventually([&] { return Job().members(0).metrics().step() == 8; }));
  EXPECT_EQ(reporter.verdict().state, v1::JOB_STATE_RUNNING);
  // The sender counts a heartbeat just after Send() returns, which can be
  // after the coordinator already shows it.
  EXPECT_TRUE(Eventually([&] { return reporter.stats().heartbeats_sent >= 2; }));
  EXPECT_EQ(reporter.stats().failed_streams, 0);
}

TEST_F(HealthReporterTest, FinishReportsSuccessAndTheMemberIsNotLost) {
  StartCoordinator();
  v1::Assignment a = JoinOne("inc-a");
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(a, "inc-a");
  reporter.Update(Step(100));
  ASSERT_TRUE(Eventually([&] { return reporter.stats().answers > 0; }));
  ASSERT_TRUE(reporter.Finish(true, 0, "").ok());
  EXPECT_EQ(reporter.verdict().state, v1::JOB_STATE_SUCCEEDED);
  v1::JobStatus job = Job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.members(0).state(), v1::MEMBER_STATE_EXITED);
  EXPECT_EQ(job.members(0).metrics().step(), 100) << "the final metrics";
}

TEST_F(HealthReporterTest, FinishReportsFailureWithExitCodeAndMessage) {
  StartCoordinator();
  v1::Assignment a = JoinOne("inc-a");
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(a, "inc-a");
  ASSERT_TRUE(reporter.Finish(false, 3, "loss is NaN at step 12").ok());
  v1::JobStatus job = Job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(),
              HasSubstr("failed with exit code 3: loss is NaN at step 12"));
}

TEST_F(HealthReporterTest, AFailureMessageOverTheLimitIsCutNotRefused) {
  StartCoordinator();
  v1::Assignment a = JoinOne("inc-a");
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(a, "inc-a");
  // A strict load_state_dict's list of missing keys can run to kilobytes.
  const std::string message =
      "missing keys: " + std::string(3 * kMaxErrorBytes, 'k');
  ASSERT_TRUE(reporter.Finish(false, 1, message).ok());
  v1::JobStatus job = Job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("missing keys: kkk"));
  EXPECT_THAT(job.reason(), HasSubstr("bytes cut)"));
}

TEST_F(HealthReporterTest, FinishBeforeStartIsRefused) {
  StartCoordinator();
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  EXPECT_EQ(reporter.Finish(true, 0, "").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(HealthReporterTest, DeadCoordinatorNeverBlocksUpdatesAndIsRetried) {
  // The worker joined; then its coordinator went away. Its state is kept
  // (here in memory) for the coordinator that comes back on the same port,
  // so the member is known there whenever its first heartbeat arrives.
  StartCoordinator(/*port=*/0, &storage_);
  const int port = port_;
  const v1::Assignment a = JoinOne("inc-late");
  ASSERT_EQ(a.rank(), 0);
  coordinator_.reset();

  auto client = Client(port);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(a, "inc-late");
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10000; ++i) reporter.Update(Step(i));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2))
      << "Update() must not wait for the network";
  ASSERT_TRUE(Eventually([&] { return reporter.stats().failed_streams >= 3; }));
  EXPECT_EQ(reporter.stats().answers, 0);

  // The coordinator comes back: heartbeats flow again.
  StartCoordinator(port, &storage_);
  ASSERT_TRUE(Eventually([&] { return reporter.stats().answers > 0; }));
  ASSERT_TRUE(Eventually([&] { return Job().members(0).metrics().step() == 9999; }));
}

TEST_F(HealthReporterTest, RoundStartReportsAreStoredByThePollAndOutliveARestart) {
  StartCoordinator(/*port=*/0, &storage_);
  const int port = port_;
  JoinOne("inc-a");
  // A new process on the node: round 2 forms as a recovery.
  const v1::Assignment b = JoinOne("inc-b");
  auto client = Client(port);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(b, "inc-b");
  v1::WorkerMetrics started = Step(0);
  started.mutable_round_start()->mutable_first_step()->set_seconds(2);
  reporter.Update(started);
  const auto reports = [](const v1::JobStatus& job) {
    return job.recoveries_size() == 0
               ? 0
               : job.recoveries(job.recoveries_size() - 1).round_start_reports();
  };
  ASSERT_TRUE(Eventually([&] { return reports(Job()) == 1; }));
  // Stored by a poll of the running coordinator (not only as it stops).
  ASSERT_TRUE(Eventually([&] {
    v1::JobStatus stored;
    absl::StatusOr<std::string> record = storage_.Get("jobs/train");
    return record.ok() && stored.ParseFromString(*record) &&
           reports(stored) == 1;
  }));
  reporter.Stop();
  coordinator_.reset();
  StartCoordinator(port, &storage_);
  const v1::JobStatus restored = Job();
  EXPECT_EQ(reports(restored), 1) << restored.DebugString();
  ASSERT_GT(restored.recoveries_size(), 0);
  EXPECT_EQ(restored.recoveries(restored.recoveries_size() - 1)
                .round_start()
                .first_step()
                .seconds(),
            2);
}

TEST_F(HealthReporterTest, RefusedMemberWaitsForANewStart) {
  StartCoordinator();
  v1::Assignment a = JoinOne("inc-a");
  auto client = Client(port_);
  HealthReporter reporter(client.get(), FastOptions());
  reporter.Start(a, "not-my-incarnation");  // FAILED_PRECONDITION
  ASSERT_TRUE(Eventually([&] { return reporter.stats().failed_streams == 1; }));
  reporter.Start(a, "inc-a");
  ASSERT_TRUE(Eventually([&] { return reporter.stats().answers > 0; }));
  EXPECT_EQ(reporter.stats().failed_streams, 1)
      << "a refused member is not retried";
  EXPECT_EQ(reporter.verdict().state, v1::JOB_STATE_RUNNING);
}

// Heartbeat streams that count what they are handed and let the test
// answer as the coordinator would, with no network. Thread-safe.
class ScriptedStreams {
 public:
  // For HealthReporterOptions::open_stream.
  std::function<std::unique_ptr<HeartbeatStream>(
      std::function<void(const v1::HeartbeatResponse&)>)>
  Opener() {
    return [this](std::function<void(const v1::HeartbeatResponse&)> answer) {
      absl::MutexLock lock(&mu_);
      answers_.push_back(std::move(answer));
      return std::make_unique<Stream>(this);
    };
  }

  // Hands `response` to the answer callback of the `k`-th stream opened
  // (0: the first), as a late answer on a stream may arrive.
  void AnswerOn(size_t k, const v1::HeartbeatResponse& response) {
    std::function<void(const v1::HeartbeatResponse&)> answer;
    {
      absl::MutexLock lock(&mu_);
      ASSERT_LT(k, answers_.size()) << "stream " << k << " never opened";
      answer = answers_[k];
    }
    answer(response);
  }

  // Waits (bounded) until `n` streams were opened in all.
  bool WaitForOpened(size_t n) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() {
      mu_.AssertReaderHeld();
      return answers_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), kPromptly);
  }

  // Answers on the stream opened last: the job runs, at `interval`; a
  // non-zero `stacks_request` asks for the process's stacks.
  void Answer(absl::Duration interval, bool shedding,
              int64_t stacks_request = 0) {
    std::function<void(const v1::HeartbeatResponse&)> answer;
    {
      absl::MutexLock lock(&mu_);
      ASSERT_FALSE(answers_.empty()) << "no stream opened";
      answer = answers_.back();
    }
    v1::HeartbeatResponse response;
    response.set_job_state(v1::JOB_STATE_RUNNING);
    *response.mutable_heartbeat_interval() = ToProtoDuration(interval);
    response.set_shedding_load(shedding);
    response.set_stacks_request(stacks_request);
    answer(response);
  }

  int64_t sent() const {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  // The thread stacks each heartbeat sent so far carried (their request
  // ids, in order).
  std::vector<int64_t> stacks_sent() const {
    absl::MutexLock lock(&mu_);
    return stacks_sent_;
  }
  // The last_started_collective of the last heartbeat sent (-1: none yet).
  int64_t last_started_sent() const {
    absl::MutexLock lock(&mu_);
    return last_started_;
  }
  // Waits (bounded) until `n` heartbeats were sent in all.
  bool WaitForSent(int64_t n) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() {
      mu_.AssertReaderHeld();
      return sent_ >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), kPromptly);
  }

 private:
  class Stream final : public HeartbeatStream {
   public:
    explicit Stream(ScriptedStreams* streams) : streams_(streams) {}
    bool Send(v1::HeartbeatRequest request) override {
      absl::MutexLock lock(&streams_->mu_);
      ++streams_->sent_;
      streams_->last_started_ = request.metrics().last_started_collective();
      if (request.metrics().has_thread_stacks()) {
        streams_->stacks_sent_.push_back(
            request.metrics().thread_stacks().request());
      }
      return true;
    }
    std::optional<absl::Status> ended() const override { return std::nullopt; }
    absl::Status Close(absl::Duration) override { return absl::OkStatus(); }

   private:
    ScriptedStreams* const streams_;
  };

  mutable absl::Mutex mu_;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_started_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> stacks_sent_ ABSL_GUARDED_BY(mu_);
  // Each opened stream's answer callback, in the order opened.
  std::vector<std::function<void(const v1::HeartbeatResponse&)>> answers_
      ABSL_GUARDED_BY(mu_);
};

// A client of no coordinator (it never connects): for reporters whose
// streams are scripted.
std::unique_ptr<CoordinatorClient> UnreachableClient() {
  ClientOptions options;
  options.target = "127.0.0.1:1";
  return *GrpcCoordinatorClient::Create(options);
}

// FastOptions() heartbeating every `interval` on `streams`.
HealthReporterOptions ScriptedOptions(ScriptedStreams* streams,
                                      absl::Duration interval) {
  HealthReporterOptions options = FastOptions();
  options.interval = interval;
  options.open_stream = streams->Opener();
  return options;
}

v1::Assignment Member(int rank) {
  v1::Assignment a;
  a.set_job_id("train");
  a.set_round(1);
  a.set_rank(rank);
  return a;
}

TEST(HealthReporterIntervalTest, SendsAtTheIntervalTheCoordinatorAsksFor) {
  std::unique_ptr<CoordinatorClient> client = UnreachableClient();
  ScriptedStreams slowed, peer_streams;
  HealthReporterOptions options = FastOptions();
  options.interval = absl::Milliseconds(20);
  options.open_stream = slowed.Opener();
  HealthReporter reporter(client.get(), options);
  // A peer at 20 ms, never answered: the clock this test compares with.
  options.open_stream = peer_streams.Opener();
  HealthReporter peer(client.get(), options);
  reporter.Start(Member(0), "inc-0");
  peer.Start(Member(1), "inc-1");
  ASSERT_TRUE(slowed.WaitForSent(2));
  EXPECT_EQ(reporter.interval(), absl::Milliseconds(20));

  // The coordinator sheds load: an hour between heartbeats.
  slowed.Answer(absl::Hours(1), /*shedding=*/true);
  EXPECT_EQ(reporter.interval(), absl::Hours(1));
  const int64_t at_answer = slowed.sent();
  // While the peer sends 10 more (200 ms), the reporter sends at most the
  // one it may have been about to send.
  ASSERT_TRUE(peer_streams.WaitForSent(peer_streams.sent() + 10));
  EXPECT_LE(slowed.sent(), at_answer + 1);

  // Back at the job's interval: it does not wait out the hour.
  slowed.Answer(absl::Milliseconds(20), /*shedding=*/false);
  EXPECT_EQ(reporter.interval(), absl::Milliseconds(20));
  ASSERT_TRUE(slowed.WaitForSent(slowed.sent() + 3));
  reporter.Stop();
  peer.Stop();
}

// An answer for the last round's member that arrives on its stream after
// Start() began the next round's member is not the new member's verdict:
// no re-form asked, no failure, no round over.
TEST(HealthReporterGenerationTest, ALateAnswerToTheLastRoundIsIgnored) {
  std::unique_ptr<CoordinatorClient> client = UnreachableClient();
  ScriptedStreams streams;
  HealthReporterOptions options =
      ScriptedOptions(&streams, absl::Milliseconds(20));
  HealthReporter reporter(client.get(), options);
  std::atomic<int> rounds_over{0};
  const auto count = [&rounds_over](const absl::Status&) { ++rounds_over; };
  reporter.Start(Member(0), "inc-0", count);
  ASSERT_TRUE(streams.WaitForSent(1));
  v1::Assignment next = Member(0);
  next.set_round(2);
  reporter.Start(next, "inc-0", count);
  ASSERT_TRUE(streams.WaitForOpened(2)) << "no stream for round 2";

  v1::HeartbeatResponse late;
  late.set_job_state(v1::JOB_STATE_FAILED);
  late.set_reason("round 1 was superseded");
  late.set_reform_at_step_boundary(true);
  streams.AnswerOn(0, late);
  EXPECT_FALSE(reporter.verdict().reform_at_step_boundary);
  EXPECT_NE(reporter.verdict().state, v1::JOB_STATE_FAILED);
  EXPECT_EQ(rounds_over, 0);

  v1::HeartbeatResponse current;
  current.set_job_state(v1::JOB_STATE_RUNNING);
  current.set_reform_at_step_boundary(true);
  streams.AnswerOn(1, current);
  EXPECT_TRUE(reporter.verdict().reform_at_step_boundary);
  reporter.Stop();
}

// A request for stacks is answered at once, not at the next interval, and
// once per request id.
TEST(HealthReporterStacksTest, AnswersAStacksRequestAtOnceAndOnce) {
  std::unique_ptr<CoordinatorClient> client = UnreachableClient();
  ScriptedStreams streams;
  HealthReporterOptions options =
      ScriptedOptions(&streams, absl::Hours(1));  // nothing but the first and the asked
  std::vector<int64_t> captured;
  absl::Mutex mu;
  options.capture_stacks = [&](int64_t request) {
    absl::MutexLock lock(&mu);
    captured.push_back(request);
    v1::ThreadStacks stacks;
    stacks.set_request(request);
    return stacks;
  };
  HealthReporter reporter(client.get(), options);
  reporter.Start(Member(0), "inc-0");
  ASSERT_TRUE(streams.WaitForSent(1));

  streams.Answer(absl::Hours(1), /*shedding=*/false, /*stacks_request=*/41);
  ASSERT_TRUE(streams.WaitForSent(2)) << "answered at once";
  EXPECT_EQ(streams.stacks_sent(), std::vector<int64_t>{41});
  // The same request again (a repeated answer) is not answered again; a new
  // one is.
  streams.Answer(absl::Hours(1), false, 41);
  streams.Answer(absl::Hours(1), false, 42);
  ASSERT_TRUE(streams.WaitForSent(3));
  reporter.Stop();
  EXPECT_EQ(streams.stacks_sent(), (std::vector<int64_t>{41, 42}));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(captured, (std::vector<int64_t>{41, 42}));
}

// The live fields are read as each heartbeat is sent: a collective
// counter that moved after the last Update() shows in the next heartbeat
// (a rank stuck in a collective reports it without a step ending); once
// cleared, the snapshot's own value goes again.
TEST(HealthReporterLiveFieldsTest, EachHeartbeatReadsThemAsItIsSent) {
  std::unique_ptr<CoordinatorClient> client = UnreachableClient();
  ScriptedStreams streams;
  HealthReporterOptions options =
      ScriptedOptions(&streams, absl::Milliseconds(20));
  HealthReporter reporter(client.get(), options);
  std::atomic<int64_t> started{5};
  reporter.SetLiveFields([&started](v1::WorkerMetrics* m) {
    m->set_last_started_collective(started.load());
  });
  reporter.Start(Member(0), "inc-0");
  v1::WorkerMetrics step = Step(1);
  step.set_last_started_collective(1);
  reporter.Update(step);
  ASSERT_TRUE(streams.WaitForSent(1));
  EXPECT_EQ(streams.last_started_sent(), 5);
  started = 9;  // no Update()
  ASSERT_TRUE(streams.WaitForSent(streams.sent() + 2));
  EXPECT_EQ(streams.last_started_sent(), 9);
  reporter.SetLiveFields(nullptr);
  started = 11;
  ASSERT_TRUE(streams.WaitForSent(streams.sent() + 2));
  EXPECT_EQ(streams.last_started_sent(), 1);
  reporter.Stop();
}

}  // namespace
}  // namespace gradsync
