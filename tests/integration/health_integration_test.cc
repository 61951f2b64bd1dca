// Failure detection end to end: a real Coordinator on a loopback port whose
// time is a FakeClock (so detection is stepped, not waited for), workers
// joined through the client library, heartbeat streams, completion reports,
// WatchJob, and the Prometheus endpoint parsed by python3-prometheus-client.
#include <httplib.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "tests/testing/eventually.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kPromptly = absl::Seconds(10);
constexpr absl::Duration kRetention = absl::Minutes(10);

// The answers one heartbeat stream received. Thread-safe.
class Answers {
 public:
  std::function<void(const v1::HeartbeatResponse&)> Callback() {
    return [this](const v1::HeartbeatResponse& r) {
      absl::MutexLock lock(&mu_);
      answers_.push_back(r);
    };
  }
  // Waits (bounded) for an answer with `state`.
  bool WaitFor(v1::JobState state, v1::HeartbeatResponse* out = nullptr) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() {
      mu_.AssertReaderHeld();
      for (const auto& a : answers_) {
        if (a.job_state() == state) {
          if (out != nullptr) *out = a;
          return true;
        }
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), kPromptly);
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::HeartbeatResponse> answers_ ABSL_GUARDED_BY(mu_);
};

class HealthIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorConfig config;
    config.listen_address = "127.0.0.1:0";
    config.metrics_listen_address = "127.0.0.1:0";
    config.poll_interval = absl::Milliseconds(2);
    config.retention = kRetention;
    config.clock = &clock_;
    coordinator_ = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator_->Start().ok());
    ClientOptions options;
    options.target = absl::StrCat("127.0.0.1:", coordinator_->port());
    auto client = GrpcCoordinatorClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  void TearDown() override { coordinator_->Shutdown(); }

  // Joins `world` workers (one node each) to `job` and returns their
  // assignments by rank; incarnations_[rank] is each one's incarnation.
  std::vector<v1::Assignment> JoinAll(const std::string& job, int world) {
    v1::JobConfig config;
    config.set_job_id(job);
    config.set_min_nodes(world);
    *config.mutable_last_call_timeout() = ToProtoDuration(absl::ZeroDuration());
    std::vector<v1::Assignment> by_join(world);
    std::vector<std::string> incarnation(world);
    std::vector<std::thread> threads;
    for (int i = 0; i < world; ++i) {
      v1::JoinRequest request;
      request.set_job_id(job);
      *request.mutable_config() = config;
      *request.mutable_node() = LocalNodeDescriptor();
      request.mutable_node()->set_node_id(absl::StrCat("node-", i));
      request.mutable_node()->set_hostname(absl::StrCat("host-", i));
      incarnation[i] = request.node().incarnation_id();
      threads.emplace_back([this, request, &by_join, i] {
        absl::StatusOr<v1::Assignment> a = client_->Join(request);
        EXPECT_TRUE(a.ok()) << a.status();
        if (a.ok()) by_join[i] = *a;
      });
    }
    for (auto& t : threads) t.join();
    std::vector<v1::Assignment> by_rank(world);
    incarnations_.assign(world, "");
    for (int i = 0; i < world; ++i) {
      by_rank[by_join[i].rank()] = by_join[i];
      incarnations_[by_join[i].rank()] = incarnation[i];
    }
    return by_rank;
  }

  v1::HeartbeatRequest Heartbeat(const v1::Assignment& a,
                                 v1::WorkerMetrics metrics = {}) {
    v1::HeartbeatRequest request;
    request.mutable_member()->set_job_id(a.job_id());
    request.mutable_member()->set_round(a.round());
    request.mutable_member()->set_rank(a.rank());
    request.mutable_member()->set_incarnation_id(incarnations_[a.rank()]);
    *request.mutable_metrics() = std::move(metrics);
    return request;
  }

  v1::ReportCompletionRequest Completion(const v1::Assignment& a, bool success,
                                         int exit_code = 0) {
    v1::ReportCompletionRequest request;
    *request.mutable_member() = Heartbeat(a).member();
    request.set_success(success);
    request.set_exit_code(exit_code);
    return request;
  }

  // One heartbeat stream and the answers it received.
  struct Beater {
    Answers answers;
    std::unique_ptr<HeartbeatStream> stream;
  };

  // Opens a stream per member, sends its first heartbeat (with
  // `metrics(rank)`) and waits for the coordinator's answer.
  std::vector<std::unique_ptr<Beater>> StartBeating(
      const std::vector<v1::Assignment>& members,
      const std::function<v1::WorkerMetrics(int)>& metrics =
          [](int) { return v1::WorkerMetrics(); }) {
    std::vector<std::unique_ptr<Beater>> beaters;
    for (const v1::Assignment& a : members) {
      auto beater = std::make_unique<Beater>();
      beater->stream = client_->OpenHeartbeatStream(beater->answers.Callback());
      EXPECT_TRUE(beater->stream->Send(Heartbeat(a, metrics(a.rank()))));
      EXPECT_TRUE(beater->answers.WaitFor(v1::JOB_STATE_RUNNING));
      beaters.push_back(std::move(beater));
    }
    return beaters;
  }

  v1::JobStatus Job(const std::string& job) {
    absl::StatusOr<v1::JobStatus> status = client_->GetJob(job);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  // Waits until the coordinator has seen the stream of `rank` break (the
  // member, still ACTIVE, is in its reconnect grace).
  bool InGrace(const std::string& job, int rank) {
    return Eventually([&] {
      const v1::JobStatus status = Job(job);
      return status.members_size() > rank &&
             status.members(rank).state() == v1::MEMBER_STATE_ACTIVE &&
             absl::StrContains(status.members(rank).state_reason(),
                               "heartbeat stream broke");
    });
  }

  // Steps the fake clock `seconds` times by 1 s; after each step `stream`
  // heartbeats for `member` and the coordinator has handled it.
  void AdvanceBeating(int seconds, HeartbeatStream* stream,
                      const v1::Assignment& member) {
    for (int i = 0; i < seconds; ++i) {
      clock_.Advance(absl::Seconds(1));
      ASSERT_TRUE(stream->Send(Heartbeat(member)));
      ASSERT_TRUE(Eventually([&] {
        return FromProtoTime(
                   Job(member.job_id()).members(member.rank()).last_seen()) ==
               clock_.Now();
      }));
    }
  }

  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
  std::vector<std::string> incarnations_;
};

TEST_F(HealthIntegrationTest, HeartbeatsAreAnsweredAndShowInStatus) {
  std::vector<v1::Assignment> a = JoinAll("beats", 2);
  Answers answers;
  auto stream = client_->OpenHeartbeatStream(answers.Callback());
  v1::WorkerMetrics m;
  m.set_state(v1::WORKER_STATE_TRAINING);
  m.set_step(17);
  m.set_samples_per_second(321);
  ASSERT_TRUE(stream->Send(Heartbeat(a[1], m)));
  v1::HeartbeatResponse first;
  ASSERT_TRUE(answers.WaitFor(v1::JOB_STATE_RUNNING, &first));
  EXPECT_EQ(FromProtoDuration(first.heartbeat_interval()), absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return Job("beats").members(1).has_metrics(); }));
  v1::JobStatus job = Job("beats");
  EXPECT_EQ(job.members(1).metrics().step(), 17);
  EXPECT_EQ(job.members(1).metrics().samples_per_second(), 321);
  EXPECT_EQ(FromProtoTime(job.members(1).last_seen()), clock_.Now());
  EXPECT_TRUE(stream->Close(kPromptly).ok());
}

// Sends racing the coordinator's end of the stream (a member it does not
// know) never touch the finished call: they are refused once the call ends.
TEST_F(HealthIntegrationTest, SendsRacingTheEndOfTheStreamAreRefused) {
  v1::HeartbeatRequest unknown;
  unknown.mutable_member()->set_job_id("nobody");
  unknown.mutable_member()->set_round(1);
  unknown.mutable_member()->set_incarnation_id("inc");
  for (int i = 0; i < 200; ++i) {
    Answers answers;
    auto stream = client_->OpenHeartbeatStream(answers.Callback());
    const absl::Time deadline = absl::Now() + kPromptly;
    while (stream->Send(unknown) && absl::Now() < deadline) {
    }
    ASSERT_TRUE(Eventually([&] { return stream->ended().has_value(); }));
    EXPECT_TRUE(absl::IsNotFound(*stream->ended())) << *stream->ended();
    EXPECT_FALSE(stream->Send(unknown));
  }
}

TEST_F(HealthIntegrationTest, SilentMemberIsLostAfterThreeIntervals) {
  std::vector<v1::Assignment> a = JoinAll("silent", 2);
  std::vector<std::unique_ptr<Beater>> beaters = StartBeating(a);
  HeartbeatStream* s0 = beaters[0]->stream.get();
  // Rank 0 keeps beating on the fake clock; rank 1's stream stays open but
  // silent (a hung process).
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(s0->Send(Heartbeat(a[0])));
    ASSERT_TRUE(Eventually([&] {
      return FromProtoTime(Job("silent").members(0).last_seen()) ==
             clock_.Now();
    }));
  }
  EXPECT_EQ(Job("silent").state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(100));
  // Under the default policy (recover) the round is superseded at once: the
  // job waits for its survivors to re-form it.
  ASSERT_TRUE(Eventually(
      [&] { return Job("silent").state() == v1::JOB_STATE_WAITING; }));
  v1::JobStatus job = Job("silent");
  EXPECT_EQ(job.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_EQ(job.members(0).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_THAT(job.reason(), HasSubstr("rank 1 (host-"));
  EXPECT_THAT(job.reason(), HasSubstr("lost: missed 3 heartbeats"));
  // Rank 0 learns that its round is over on its next heartbeat: the stream
  // ends with ABORTED (rejoin).
  ASSERT_TRUE(Eventually([&] {
    s0->Send(Heartbeat(a[0]));
    return s0->ended().has_value();
  }));
  EXPECT_EQ(s0->ended()->code(), absl::StatusCode::kAborted) << *s0->ended();
}

TEST_F(HealthIntegrationTest, BrokenStreamIsLostAfterTheGraceAndClosedIsNot) {
  std::vector<v1::Assignment> a = JoinAll("broken", 2);
  std::vector<std::unique_ptr<Beater>> beaters = StartBeating(a);
  // A clean close (half-close, then the coordinator's OK) starts no grace;
  // the member goes on on a new stream.
  EXPECT_TRUE(beaters[0]->stream->Close(kPromptly).ok());
  beaters[0] = std::move(StartBeating({a[0]})[0]);
  // Destroying an open stream cancels it, as a killed process's would be.
  beaters[1]->stream.reset();
  ASSERT_TRUE(InGrace("broken", 1));
  EXPECT_THAT(Job("broken").members(1).state_reason(),
              HasSubstr("LOST unless it heartbeats again within 3s"));
  EXPECT_THAT(Job("broken").members(0).state_reason(),
              ::testing::Not(HasSubstr("stream broke")));
  AdvanceBeating(3, beaters[0]->stream.get(), a[0]);
  EXPECT_EQ(Job("broken").state(), v1::JOB_STATE_RUNNING) << "in the grace";
  clock_.Advance(absl::Milliseconds(100));
  // LOST first (the job DEGRADED), then WAITING once the rendezvous has
  // superseded the round for rank 0 to re-form it.
  ASSERT_TRUE(Eventually(
      [&] { return Job("broken").state() == v1::JOB_STATE_WAITING; }));
  v1::JobStatus job = Job("broken");
  EXPECT_EQ(job.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_THAT(job.members(1).state_reason(),
              HasSubstr("stream broke (process killed or connection lost) and "
                        "it did not heartbeat again within 3s"));
  EXPECT_EQ(job.members(0).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(job.state(), v1::JOB_STATE_WAITING) << "re-forming without rank 1";
  EXPECT_THAT(job.reason(), HasSubstr("lost: heartbeat stream broke"));
  EXPECT_EQ(job.summary().active(), 1);
  EXPECT_EQ(job.summary().lost(), 1);
  v1::GetJobRequest request;
  request.set_job_id("broken");
  request.mutable_members()->set_unhealthy_only(true);
  absl::StatusOr<v1::GetJobResponse> unhealthy = client_->QueryJob(request);
  ASSERT_TRUE(unhealthy.ok()) << unhealthy.status();
  ASSERT_EQ(unhealthy->job().members_size(), 1);
  EXPECT_EQ(unhealthy->job().members(0).rank(), 1);
}

// The answers one node heartbeat stream received. Thread-safe.
class NodeAnswers {
 public:
  std::function<void(const v1::NodeHeartbeatResponse&)> Callback() {
    return [this](const v1::NodeHeartbeatResponse& r) {
      absl::MutexLock lock(&mu_);
      for (const v1::MemberHeartbeatResponse& a : r.answers()) {
        by_rank_[a.member().rank()].push_back(a);
      }
    };
  }
  // Waits (bounded) for `count` answers for `rank`; the last one.
  std::optional<v1::MemberHeartbeatResponse> WaitFor(int rank, int count = 1) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() {
      mu_.AssertReaderHeld();
      return static_cast<int>(by_rank_[rank].size()) >= count;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&seen), kPromptly)) {
      return std::nullopt;
    }
    return by_rank_[rank].back();
  }

 private:
  absl::Mutex mu_;
  std::map<int, std::vector<v1::MemberHeartbeatResponse>> by_rank_
      ABSL_GUARDED_BY(mu_);
};

// A blip (a proxy restart, reset connections) breaks every member's stream
// at once; each heartbeats again on a new stream 2 s later, inside the
// reconnect grace (3 s): at 1,000 members nobody is LOST and the job does
// not re-form. A one-member job whose stream breaks at the same moment and
// stays away is LOST once the grace ends, which shows detection ran past it.
TEST_F(HealthIntegrationTest, BlipsShorterThanTheGraceLoseNobodyAt1000Members) {
  constexpr int kWorld = 1000;
  std::vector<v1::Assignment> sentinel = JoinAll("sentinel", 1);
  std::vector<std::unique_ptr<Beater>> sentinel_beater = StartBeating(sentinel);
  std::vector<v1::Assignment> a = JoinAll("blips", kWorld);
  std::vector<std::unique_ptr<Beater>> beaters = StartBeating(a);

  sentinel_beater.clear();  // cancelled, as by a reset
  beaters.clear();
  ASSERT_TRUE(InGrace("sentinel", 0));
  ASSERT_TRUE(Eventually([&] {
    const v1::JobStatus job = Job("blips");
    for (const v1::Member& m : job.members()) {
      if (!absl::StrContains(m.state_reason(), "stream broke")) return false;
    }
    return true;
  }));
  clock_.Advance(absl::Seconds(2));
  beaters = StartBeating(a);  // reconnected
  clock_.Advance(absl::Milliseconds(1500));
  ASSERT_TRUE(Eventually([&] {
    return Job("sentinel").members(0).state() == v1::MEMBER_STATE_LOST;
  }));
  const v1::JobStatus job = Job("blips");
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.round(), 1);
  EXPECT_EQ(job.recovery_count(), 0);
  int active = 0;
  for (const v1::Member& m : job.members()) {
    active += m.state() == v1::MEMBER_STATE_ACTIVE ? 1 : 0;
    EXPECT_THAT(m.state_reason(), ::testing::Not(HasSubstr("stream broke")));
  }
  EXPECT_EQ(active, kWorld);
}

TEST_F(HealthIntegrationTest, NodeStreamAnswersEachMemberAndAnErrorEndsOnlyItsPlace) {
  std::vector<v1::Assignment> a = JoinAll("node", 3);
  NodeAnswers answers;
  auto stream = client_->OpenNodeHeartbeatStream(answers.Callback());
  v1::NodeHeartbeatRequest batch;
  v1::WorkerMetrics m;
  m.set_step(5);
  *batch.add_heartbeats() = Heartbeat(a[0], m);
  *batch.add_heartbeats() = Heartbeat(a[1], m);
  v1::HeartbeatRequest impostor = Heartbeat(a[2]);
  impostor.mutable_member()->set_incarnation_id("not-rank-2");
  *batch.add_heartbeats() = impostor;
  ASSERT_TRUE(stream->Send(batch));
  for (int rank : {0, 1}) {
    std::optional<v1::MemberHeartbeatResponse> answer = answers.WaitFor(rank);
    ASSERT_TRUE(answer.has_value()) << "rank " << rank;
    EXPECT_EQ(answer->error_code(), 0);
    EXPECT_EQ(answer->response().job_state(), v1::JOB_STATE_RUNNING);
  }
  std::optional<v1::MemberHeartbeatResponse> refused = answers.WaitFor(2);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->error_code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(refused->error_message().empty());
  // The stream goes on: rank 2 itself gets a place, and its first answer.
  v1::NodeHeartbeatRequest next;
  *next.add_heartbeats() = Heartbeat(a[2], m);
  ASSERT_TRUE(stream->Send(next));
  std::optional<v1::MemberHeartbeatResponse> answer = answers.WaitFor(2, 2);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->error_code(), 0);
  v1::JobStatus job = Job("node");
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(job.members(rank).metrics().step(), 5) << "rank " << rank;
  }
  EXPECT_FALSE(stream->ended().has_value());
  EXPECT_TRUE(stream->Close(kPromptly).ok());
}

TEST_F(HealthIntegrationTest, BrokenNodeStreamLosesItsMembersButNotClosedOnes) {
  std::vector<v1::Assignment> a = JoinAll("node-broken", 2);
  // Rank 0 leaves its node stream cleanly; then that stream breaks (its
  // process was killed): rank 0 is not LOST.
  {
    NodeAnswers answers;
    auto stream = client_->OpenNodeHeartbeatStream(answers.Callback());
    v1::NodeHeartbeatRequest batch;
    *batch.add_heartbeats() = Heartbeat(a[0]);
    ASSERT_TRUE(stream->Send(batch));
    ASSERT_TRUE(answers.WaitFor(0));
    v1::NodeHeartbeatRequest leave;
    *leave.add_closed() = Heartbeat(a[0]).member();
    ASSERT_TRUE(stream->Send(leave));
    // A leave has no answer: the answer to a heartbeat behind it (of a
    // member of no job, refused, so it takes no place) shows that the leave
    // was handled.
    v1::NodeHeartbeatRequest probe;
    v1::HeartbeatRequest* nobody = probe.add_heartbeats();
    nobody->mutable_member()->set_job_id("nobody");
    nobody->mutable_member()->set_round(1);
    nobody->mutable_member()->set_rank(99);
    nobody->mutable_member()->set_incarnation_id("inc");
    ASSERT_TRUE(stream->Send(probe));
    std::optional<v1::MemberHeartbeatResponse> refused = answers.WaitFor(99);
    ASSERT_TRUE(refused.has_value());
    EXPECT_EQ(refused->error_code(),
              static_cast<int>(absl::StatusCode::kNotFound));
  }  // cancelled
  // Rank 1 on another node stream that breaks: LOST.
  NodeAnswers answers;
  auto stream = client_->OpenNodeHeartbeatStream(answers.Callback());
  v1::NodeHeartbeatRequest batch;
  *batch.add_heartbeats() = Heartbeat(a[1]);
  ASSERT_TRUE(stream->Send(batch));
  ASSERT_TRUE(answers.WaitFor(1));
  EXPECT_EQ(Job("node-broken").state(), v1::JOB_STATE_RUNNING);
  stream.reset();  // cancels it
  ASSERT_TRUE(InGrace("node-broken", 1));
  EXPECT_THAT(Job("node-broken").members(0).state_reason(),
              ::testing::Not(HasSubstr("stream broke")));
  Beater zero;  // rank 0 heartbeats on through the grace
  zero.stream = client_->OpenHeartbeatStream(zero.answers.Callback());
  AdvanceBeating(3, zero.stream.get(), a[0]);
  clock_.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(Eventually(
      [&] { return Job("node-broken").state() == v1::JOB_STATE_WAITING; }));
  v1::JobStatus job = Job("node-broken");
  EXPECT_EQ(job.members(0).state(), v1::MEMBER_STATE_ACTIVE);
  EXPECT_EQ(job.members(1).state(), v1::MEMBER_STATE_LOST);
  EXPECT_THAT(job.members(1).state_reason(), HasSubstr("stream broke"));
}

TEST_F(HealthIntegrationTest, WatchSendsTheWholeStatusThenOnlyWhatChanged) {
  std::vector<v1::Assignment> a = JoinAll("delta", 3);
  std::vector<std::unique_ptr<Beater>> beaters = StartBeating(a);
  auto channel = grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", coordinator_->port()),
      grpc::InsecureChannelCredentials());
  auto jobs = v1::Jobs::NewStub(channel);
  grpc::ClientContext context;
  v1::WatchJobRequest request;
  request.set_job_id("delta");
  auto reader = jobs->WatchJob(&context, request);
  v1::WatchJobResponse first, second;
  ASSERT_TRUE(reader->Read(&first));
  EXPECT_FALSE(first.delta());
  EXPECT_EQ(first.job().members_size(), 3);
  // Rank 1 reports a new step; the next message carries rank 1 alone.
  v1::WorkerMetrics m;
  m.set_step(9);
  ASSERT_TRUE(beaters[1]->stream->Send(Heartbeat(a[1], m)));
  ASSERT_TRUE(
      Eventually([&] { return Job("delta").members(1).metrics().step() == 9; }));
  clock_.Advance(absl::Milliseconds(100));  // the watch's minimum interval
  ASSERT_TRUE(reader->Read(&second));
  EXPECT_TRUE(second.delta());
  ASSERT_EQ(second.job().members_size(), 1);
  EXPECT_EQ(second.job().members(0).rank(), 1);
  EXPECT_EQ(second.job().members(0).metrics().step(), 9);
  // Applied in order, the messages give the status GetJob gives.
  v1::JobStatus built;
  ApplyWatchResponse(first, &built);
  ApplyWatchResponse(second, &built);
  v1::JobStatus now = Job("delta");
  ASSERT_EQ(built.members_size(), now.members_size());
  for (int r = 0; r < now.members_size(); ++r) {
    EXPECT_EQ(built.members(r).SerializeAsString(),
              now.members(r).SerializeAsString())
        << "rank " << r;
  }
  context.TryCancel();
  reader->Finish().IgnoreError();
}

TEST_F(HealthIntegrationTest, CompletionEndsTheJobAndItsWatch) {
  std::vector<v1::Assignment> a = JoinAll("done", 2);
  std::vector<v1::JobState> seen;
  absl::Status watched;
  absl::Notification first_status, watch_ended;
  std::thread watcher([&] {
    watched = client_->WatchJob("done", absl::Milliseconds(100), false,
                                [&](const v1::JobStatus& job) {
                                  seen.push_back(job.state());
                                  if (seen.size() == 1) first_status.Notify();
                                  return true;
                                });
    watch_ended.Notify();
  });
  ASSERT_TRUE(first_status.WaitForNotificationWithTimeout(kPromptly));
  absl::StatusOr<v1::JobState> first =
      client_->ReportCompletion(Completion(a[0], true));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, v1::JOB_STATE_RUNNING);
  EXPECT_EQ(*client_->ReportCompletion(Completion(a[1], true)),
            v1::JOB_STATE_SUCCEEDED);
  // The coordinator polls every 2 ms and sends a watch at most every 100 ms
  // of its (fake) clock: one step lets the final status out.
  clock_.Advance(absl::Milliseconds(100));
  EXPECT_TRUE(watch_ended.WaitForNotificationWithTimeout(kPromptly));
  watcher.join();
  EXPECT_TRUE(watched.ok()) << watched;
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(seen.back(), v1::JOB_STATE_SUCCEEDED);
  // An ended job refuses joins.
  v1::JoinRequest late;
  late.set_job_id("done");
  *late.mutable_node() = LocalNodeDescriptor();
  EXPECT_EQ(client_->Join(late).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(HealthIntegrationTest, EndedJobIsForgottenAfterRetentionAndItsIdReused) {
  std::vector<v1::Assignment> a = JoinAll("again", 1);
  ASSERT_EQ(*client_->ReportCompletion(Completion(a[0], true)),
            v1::JOB_STATE_SUCCEEDED);
  clock_.Advance(kRetention - absl::Seconds(1));
  EXPECT_TRUE(client_->GetJob("again").ok()) << "still within retention";
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Eventually([&] {
    return client_->GetJob("again").status().code() ==
           absl::StatusCode::kNotFound;
  }));
  // Every manager forgot it: the id starts a fresh job at round 1.
  std::vector<v1::Assignment> fresh = JoinAll("again", 2);
  EXPECT_EQ(fresh[0].round(), 1);
  EXPECT_EQ(Job("again").state(), v1::JOB_STATE_RUNNING);
}

// A job's token goes with the job: once the job is forgotten, the old token
// authenticates nothing, so it cannot re-create the id by joining (jobs are
// created on join here).
// A coordinator on a loopback port with tokens on (the admin's:
// "admin-secret"), polling every 2 ms.
CoordinatorConfig WithTokens() {
  CoordinatorConfig config;
  config.listen_address = "127.0.0.1:0";
  config.poll_interval = absl::Milliseconds(2);
  config.admin_token = "admin-secret";
  config.completion_queues = 2;
  return config;
}

TEST(ForgottenJobTokenTest, AnOldTokenCannotRecreateTheJob) {
  FakeClock clock;
  CoordinatorConfig config = WithTokens();
  config.retention = kRetention;
  config.clock = &clock;
  Coordinator coordinator(config);
  ASSERT_TRUE(coordinator.Start().ok());
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", coordinator.port());
  options.token = "admin-secret";
  std::unique_ptr<CoordinatorClient> admin = *GrpcCoordinatorClient::Create(options);
  v1::JobConfig job;
  job.set_job_id("tokened");
  job.set_min_nodes(1);
  job.set_max_nodes(1);
  absl::StatusOr<v1::CreateJobResponse> created = admin->CreateJob(job);
  ASSERT_TRUE(created.ok()) << created.status();
  options.token = created->token();
  options.retry.max_attempts = 1;
  std::unique_ptr<CoordinatorClient> worker = *GrpcCoordinatorClient::Create(options);
  v1::JoinRequest join;
  join.set_job_id("tokened");
  *join.mutable_node() = LocalNodeDescriptor();
  absl::StatusOr<v1::Assignment> a = worker->Join(join, kPromptly);
  ASSERT_TRUE(a.ok()) << a.status();
  v1::ReportCompletionRequest done;
  done.mutable_member()->set_job_id("tokened");
  done.mutable_member()->set_round(a->round());
  done.mutable_member()->set_rank(a->rank());
  done.mutable_member()->set_incarnation_id(join.node().incarnation_id());
  done.set_success(true);
  ASSERT_EQ(*worker->ReportCompletion(done), v1::JOB_STATE_SUCCEEDED);

  clock.Advance(kRetention + absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] {
    return admin->GetJob("tokened").status().code() ==
           absl::StatusCode::kNotFound;
  }));
  v1::JoinRequest again = join;
  *again.mutable_node() = LocalNodeDescriptor();
  again.mutable_config()->set_job_id("tokened");
  again.mutable_config()->set_min_nodes(1);
  EXPECT_EQ(worker->Join(again, kPromptly).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(admin->GetJob("tokened").status().code(),
            absl::StatusCode::kNotFound)
      << "the refused join created nothing";
  coordinator.Shutdown();
}

// Under a heartbeat cap (10 a second here), heartbeats a caller may not
// send for the job they name take their turns in a line of their own, not
// that job's: 30 streams of another job's token naming job "victim" are
// each refused at their turn (3 s of turns), and the victim's own member
// is answered at once meanwhile, not after them.
TEST(CappedHeartbeatsTest, HeartbeatsNamingAnotherJobTakeNoTurnOfIt) {
  CoordinatorConfig config = WithTokens();
  config.max_heartbeat_rate = 10;
  Coordinator coordinator(config);
  ASSERT_TRUE(coordinator.Start().ok());
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", coordinator.port());
  options.token = "admin-secret";
  std::unique_ptr<CoordinatorClient> admin =
      *GrpcCoordinatorClient::Create(options);
  std::map<std::string, std::unique_ptr<CoordinatorClient>> clients;
  for (const std::string id : {"victim", "other"}) {
    v1::JobConfig job;
    job.set_job_id(id);
    job.set_min_nodes(1);
    absl::StatusOr<v1::CreateJobResponse> created = admin->CreateJob(job);
    ASSERT_TRUE(created.ok()) << created.status();
    options.token = created->token();
    clients[id] = *GrpcCoordinatorClient::Create(options);
  }
  v1::JoinRequest join;
  join.set_job_id("victim");
  *join.mutable_node() = LocalNodeDescriptor();
  absl::StatusOr<v1::Assignment> a = clients["victim"]->Join(join, kPromptly);
  ASSERT_TRUE(a.ok()) << a.status();
  v1::HeartbeatRequest heartbeat;
  heartbeat.mutable_member()->set_job_id("victim");
  heartbeat.mutable_member()->set_round(a->round());
  heartbeat.mutable_member()->set_rank(a->rank());
  heartbeat.mutable_member()->set_incarnation_id(join.node().incarnation_id());

  std::vector<std::unique_ptr<HeartbeatStream>> refused;
  for (int i = 0; i < 30; ++i) {
    refused.push_back(clients["other"]->OpenHeartbeatStream(
        [](const v1::HeartbeatResponse&) {}));
    ASSERT_TRUE(refused.back()->Send(heartbeat));
  }
  // The first had its turn at once: the others were read by then.
  ASSERT_TRUE(Eventually([&] { return refused[0]->ended().has_value(); }));
  Answers answers;
  std::unique_ptr<HeartbeatStream> own =
      clients["victim"]->OpenHeartbeatStream(answers.Callback());
  const absl::Time sent = absl::Now();
  ASSERT_TRUE(own->Send(heartbeat));
  ASSERT_TRUE(answers.WaitFor(v1::JOB_STATE_RUNNING));
  EXPECT_LT(absl::Now() - sent, absl::Milliseconds(1500))
      << "the victim's heartbeat waited behind the refused ones";
  for (auto& stream : refused) {
    ASSERT_TRUE(Eventually([&] { return stream->ended().has_value(); }));
    EXPECT_EQ(stream->ended()->code(), absl::StatusCode::kPermissionDenied)
        << *stream->ended();
  }
  EXPECT_TRUE(own->Close(kPromptly).ok());
  coordinator.Shutdown();
}

TEST_F(HealthIntegrationTest, FailedMemberFailsTheJob) {
  std::vector<v1::Assignment> a = JoinAll("crash", 2);
  v1::ReportCompletionRequest failure = Completion(a[1], false, 137);
  failure.set_message("killed by the OOM killer");
  EXPECT_EQ(*client_->ReportCompletion(failure), v1::JOB_STATE_FAILED);
  v1::JobStatus job = Job("crash");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("rank 1 (host-"));
  EXPECT_THAT(job.reason(),
              HasSubstr("failed with exit code 137: killed by the OOM killer"));
}

TEST_F(HealthIntegrationTest, WatchOfAnUnknownJobIsNotFound) {
  absl::Status status =
      client_->WatchJob("nope", absl::Milliseconds(100), false,
                        [](const v1::JobStatus&) { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
}

TEST_F(HealthIntegrationTest, DesyncFailsTheJobAndReachesTheWorkers) {
  std::vector<v1::Assignment> a = JoinAll("desync", 2);
  Answers answers0, answers1;
  auto s0 = client_->OpenHeartbeatStream(answers0.Callback());
  auto s1 = client_->OpenHeartbeatStream(answers1.Callback());
  auto fingerprint = [](int64_t count) {
    v1::WorkerMetrics m;
    v1::CollectiveFingerprint* f = m.add_recent_collectives();
    f->set_sequence(1);
    f->set_op("allreduce");
    f->set_dtype("float32");
    f->set_count(count);
    f->set_bucket_index(0);
    m.set_last_started_collective(1);
    return m;
  };
  ASSERT_TRUE(s0->Send(Heartbeat(a[0], fingerprint(1000))));
  ASSERT_TRUE(answers0.WaitFor(v1::JOB_STATE_RUNNING));
  ASSERT_TRUE(s1->Send(Heartbeat(a[1], fingerprint(999))));
  v1::HeartbeatResponse verdict;
  ASSERT_TRUE(answers1.WaitFor(v1::JOB_STATE_FAILED, &verdict));
  EXPECT_THAT(verdict.reason(),
              HasSubstr("collectives desynchronized at #1: rank 0 issued "
                        "allreduce of 1000 float32 (bucket 0) but rank 1 "
                        "issued allreduce of 999 float32 (bucket 0)"));
  ASSERT_TRUE(s0->Send(Heartbeat(a[0])));
  EXPECT_TRUE(answers0.WaitFor(v1::JOB_STATE_FAILED));
  EXPECT_THAT(Job("desync").diagnosis().desync(),
              HasSubstr("desynchronized at #1"));
}

TEST_F(HealthIntegrationTest, SlowRankIsFlaggedAsAStraggler) {
  std::vector<v1::Assignment> a = JoinAll("slow", 3);
  const absl::Time base = clock_.Now();
  std::vector<std::unique_ptr<Beater>> beaters = StartBeating(a, [&](int r) {
    v1::WorkerMetrics m;
    for (int step = 1; step <= 10; ++step) {
      v1::StepReady* ready = m.add_first_bucket_ready();
      ready->set_step(step);
      // Rank 2 is 300 ms late every step.
      *ready->mutable_time() = ToProtoTime(
          base + absl::Seconds(step) + (r == 2 ? absl::Milliseconds(300)
                                               : absl::Milliseconds(r * 10)));
    }
    return m;
  });
  ASSERT_TRUE(
      Eventually([&] { return Job("slow").diagnosis().stragglers_size() > 0; }));
  v1::JobStatus job = Job("slow");
  ASSERT_EQ(job.diagnosis().stragglers_size(), 1);
  EXPECT_EQ(job.diagnosis().stragglers(0).rank(), 2);
  EXPECT_EQ(FromProtoDuration(job.diagnosis().stragglers(0).lag()),
            absl::Milliseconds(300));
  EXPECT_EQ(FromProtoDuration(job.members(2).lag()), absl::Milliseconds(300));
  // The summary names it first among the slowest, and a query for the
  // unhealthy members lists it alone.
  const v1::JobSummary& summary = job.summary();
  EXPECT_EQ(summary.heard(), 3);
  EXPECT_EQ(summary.stragglers(), 1);
  ASSERT_GE(summary.slowest_size(), 1);
  EXPECT_EQ(summary.slowest(0).rank(), 2);
  EXPECT_EQ(FromProtoDuration(summary.slowest(0).lag()),
            absl::Milliseconds(300));
  v1::GetJobRequest request;
  request.set_job_id("slow");
  request.mutable_members()->set_unhealthy_only(true);
  absl::StatusOr<v1::GetJobResponse> unhealthy = client_->QueryJob(request);
  ASSERT_TRUE(unhealthy.ok()) << unhealthy.status();
  ASSERT_EQ(unhealthy->job().members_size(), 1);
  EXPECT_EQ(unhealthy->job().members(0).rank(), 2);
  EXPECT_EQ(unhealthy->job().summary().matching(), 1);
}

// Runs `command` and returns its exit status and stdout.
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  return {pclose(pipe), out};
}

TEST_F(HealthIntegrationTest, PrometheusClientParsesTheMetrics) {
  std::vector<v1::Assignment> a = JoinAll("scraped", 2);
  Answers answers;
  auto stream = client_->OpenHeartbeatStream(answers.Callback());
  v1::WorkerMetrics m;
  m.set_step(42);
  m.set_samples_per_second(1500.5);
  m.mutable_step_timings()->set_step_seconds(0.125);
  m.set_rss_bytes(int64_t{3} << 30);
  ASSERT_TRUE(stream->Send(Heartbeat(a[0], m)));
  ASSERT_TRUE(answers.WaitFor(v1::JOB_STATE_RUNNING));
  // An RPC with a latency; the hosts in the labels are the ranks' own.
  const v1::JobStatus job = Job("scraped");
  const std::string rank0 = absl::StrCat(
      "{host=", job.members(0).node().hostname(), ",job=scraped,rank=0}");
  const std::string rank1 = absl::StrCat(
      "{host=", job.members(1).node().hostname(), ",job=scraped,rank=1}");

  httplib::Client http("127.0.0.1", coordinator_->metrics_port());
  httplib::Result response = http.Get("/metrics");
  ASSERT_TRUE(response) << "GET /metrics failed";
  ASSERT_EQ(response->status, 200);
  EXPECT_THAT(response->get_header_value("Content-Type"),
              HasSubstr("text/plain; version=0.0.4"));
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                                        "/metrics.txt");
  std::ofstream(path) << response->body;

  // The real parser: every sample as "name{k=v,...} value", labels sorted.
  const std::string script = absl::StrCat(
      std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
      "/tests/integration/parse_prometheus.py");
  auto [status, out] = RunCommand(absl::StrCat("/usr/bin/python3 ", script, " ", path));
  ASSERT_EQ(status, 0) << out << "\n" << response->body;
  std::map<std::string, std::string> samples;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, ' ');
    samples[kv.first] = kv.second;
  }
  EXPECT_EQ(samples["gradsync_jobs{state=running}"], "1.0");
  EXPECT_EQ(samples["gradsync_jobs{state=failed}"], "0.0");
  EXPECT_EQ(samples["gradsync_members{state=active}"], "2.0");
  EXPECT_EQ(samples["gradsync_rendezvous_rounds{job=scraped}"], "1.0");
  EXPECT_EQ(samples["gradsync_heartbeats_total"], "1.0");
  EXPECT_EQ(samples["gradsync_replica_divergences_total"], "0.0");
  // Heartbeat load shedding: not shedding, at the job's own interval.
  EXPECT_EQ(samples["gradsync_heartbeat_overloaded"], "0.0");
  EXPECT_EQ(samples["gradsync_heartbeat_interval_factor"], "1.0");
  EXPECT_EQ(samples["gradsync_heartbeat_interval_seconds"], "1.0");
  EXPECT_EQ(samples["gradsync_heartbeat_shed_periods_total"], "0.0");
  EXPECT_EQ(samples["gradsync_heartbeat_late_ratio"], "0.0");
  EXPECT_EQ(samples["gradsync_heartbeat_behind"], "0.0");
  EXPECT_EQ(samples["gradsync_heartbeat_allowance_seconds"], "0.0");
  EXPECT_EQ(samples["gradsync_member_step" + rank0], "42.0");
  EXPECT_EQ(samples["gradsync_member_samples_per_second" + rank0], "1500.5");
  EXPECT_EQ(samples["gradsync_member_step_seconds" + rank0], "0.125");
  EXPECT_EQ(samples["gradsync_member_rss_bytes" + rank0], "3221225472.0");
  EXPECT_EQ(samples["gradsync_member_up" + rank1], "1.0");
  EXPECT_EQ(samples["gradsync_member_heartbeat_age_seconds" + rank0], "0.0");
  EXPECT_EQ(samples["gradsync_rpc_requests_total{code=OK,method=/gradsync.v1."
                    "Jobs/GetJob}"],
            "1.0");
  EXPECT_EQ(samples["gradsync_rpc_latency_seconds_count{method=/gradsync.v1."
                    "Jobs/GetJob}"],
            "1.0");
  EXPECT_EQ(samples["gradsync_rpc_latency_seconds_bucket{le=+Inf,method=/"
                    "gradsync.v1.Jobs/GetJob}"],
            "1.0");
  EXPECT_EQ(samples["gradsync_rpc_requests_total{code=OK,method=/gradsync.v1."
                    "Rendezvous/Join}"],
            "2.0");
  EXPECT_EQ(samples["gradsync_rpc_messages_received_total{method=/gradsync.v1."
                    "Monitor/Heartbeat}"],
            "1.0");
}

}  // namespace
}  // namespace gradsync
