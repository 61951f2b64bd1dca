#include "cli/job_format.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {
namespace {

using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// 2023-11-14T22:13:20Z: every age below is relative to this.
const absl::Time kNow = absl::FromUnixSeconds(1700000000);

v1::NodeDescriptor Node(const std::string& node_id, const std::string& host,
                        int64_t pid, v1::DeviceType device, int devices) {
  v1::NodeDescriptor node;
  node.set_node_id(node_id);
  node.set_hostname(host);
  node.set_pid(pid);
  node.set_incarnation_id("inc-" + node_id + "-" + std::to_string(pid));
  node.set_device_type(device);
  node.set_device_count(devices);
  node.add_addresses("10.0.0." + std::to_string(pid % 250));
  return node;
}

v1::Member ActiveMember(int rank, int local_rank, int node_rank,
                        v1::NodeDescriptor node, absl::Duration seen_ago) {
  v1::Member m;
  m.set_rank(rank);
  m.set_local_rank(local_rank);
  m.set_node_rank(node_rank);
  *m.mutable_node() = std::move(node);
  m.set_state(v1::MEMBER_STATE_ACTIVE);
  *m.mutable_last_seen() = ToProtoTime(kNow - seen_ago);
  return m;
}

v1::Member Pending(v1::MemberState state, v1::NodeDescriptor node,
                   absl::Duration seen_ago) {
  v1::Member m;
  m.set_rank(-1);
  m.set_local_rank(-1);
  m.set_node_rank(-1);
  *m.mutable_node() = std::move(node);
  m.set_state(state);
  *m.mutable_last_seen() = ToProtoTime(kNow - seen_ago);
  return m;
}

// A running job of 2 nodes x 2 processes, with one spare process.
v1::JobStatus RunningJob() {
  v1::JobStatus job;
  v1::JobConfig* c = job.mutable_config();
  c->set_job_id("resnet");
  c->set_min_nodes(2);
  c->set_max_nodes(4);
  c->set_nproc_per_node(2);
  c->set_backend(v1::BACKEND_AUTO);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_round(3);
  job.set_world_size(4);
  job.set_backend(v1::BACKEND_NCCL);
  *job.mutable_create_time() = ToProtoTime(kNow - absl::Hours(3));
  *job.mutable_update_time() = ToProtoTime(kNow - absl::Minutes(4));
  *job.mutable_round_close_time() = ToProtoTime(kNow - absl::Minutes(4));
  *job.add_members() = ActiveMember(
      0, 0, 0, Node("gpu-a", "host-a", 101, v1::DEVICE_TYPE_CUDA, 8),
      absl::Seconds(5));
  *job.add_members() = ActiveMember(
      1, 1, 0, Node("gpu-a", "host-a", 102, v1::DEVICE_TYPE_CUDA, 8),
      absl::Seconds(5));
  *job.add_members() = ActiveMember(
      2, 0, 1, Node("gpu-b", "host-b", 201, v1::DEVICE_TYPE_CUDA, 8),
      absl::Seconds(7));
  *job.add_members() = ActiveMember(
      3, 1, 1, Node("gpu-b", "host-b", 202, v1::DEVICE_TYPE_CUDA, 8),
      absl::Seconds(7));
  *job.add_spares() = Pending(
      v1::MEMBER_STATE_SPARE,
      Node("gpu-c", "host-c", 301, v1::DEVICE_TYPE_CUDA, 8), absl::Seconds(42));
  return job;
}

// A job whose first round has not closed: two processes wait.
v1::JobStatus WaitingJob() {
  v1::JobStatus job;
  v1::JobConfig* c = job.mutable_config();
  c->set_job_id("bert");
  c->set_min_nodes(3);
  c->set_max_nodes(3);
  c->set_nproc_per_node(1);
  c->set_backend(v1::BACKEND_GLOO);
  job.set_state(v1::JOB_STATE_WAITING);
  *job.mutable_create_time() = ToProtoTime(kNow - absl::Hours(24 * 3));
  *job.mutable_update_time() = job.create_time();
  *job.add_waiting() = Pending(
      v1::MEMBER_STATE_WAITING,
      Node("cpu-1", "host-1", 11, v1::DEVICE_TYPE_CPU, 1), absl::Seconds(20));
  *job.add_waiting() = Pending(
      v1::MEMBER_STATE_WAITING,
      Node("cpu-2", "host-2", 12, v1::DEVICE_TYPE_CPU, 1), absl::Minutes(2));
  return job;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// ---------------------------------------------------------------------------
// FormatJobsTable

TEST(FormatJobsTableTest, NoJobs) {
  EXPECT_EQ(FormatJobsTable({}, kNow), "no jobs\n");
}

TEST(FormatJobsTableTest, OneRowPerJobUnderAHeader) {
  std::string table = FormatJobsTable({WaitingJob(), RunningJob()}, kNow);
  std::vector<std::string> lines = Lines(table);
  ASSERT_EQ(lines.size(), 3u) << table;
  EXPECT_THAT(lines[0], ContainsRegex("^JOB +STATE +ROUND +WORLD +NODES +"
                                      "BACKEND +CREATED$"));
  EXPECT_THAT(lines[1], ContainsRegex("^bert +waiting +0 +0 +3 +- +3d ago$"));
  EXPECT_THAT(lines[2],
              ContainsRegex("^resnet +running +3 +4 +2:4 +nccl +3h ago$"));
  // Columns line up: every row starts its STATE column at the same offset.
  size_t state_column = lines[0].find("STATE");
  EXPECT_EQ(lines[1].find("waiting"), state_column);
  EXPECT_EQ(lines[2].find("running"), state_column);
  EXPECT_EQ(table.back(), '\n');
}

TEST(FormatJobsTableTest, UnsetCreateTimeShowsADash) {
  v1::JobStatus job = WaitingJob();
  job.clear_create_time();
  EXPECT_THAT(Lines(FormatJobsTable({job}, kNow))[1], ContainsRegex(" -$"));
}

TEST(FormatJobsTableTest, TimesInTheFutureShowAsZeroSeconds) {
  v1::JobStatus job = WaitingJob();
  *job.mutable_create_time() = ToProtoTime(kNow + absl::Seconds(30));
  EXPECT_THAT(Lines(FormatJobsTable({job}, kNow))[1],
              ContainsRegex(" 0s ago$"));
}

// ---------------------------------------------------------------------------
// FormatJobStatus

TEST(FormatJobStatusTest, SummaryAndMemberRows) {
  std::string text = FormatJobStatus(RunningJob(), kNow);
  EXPECT_THAT(text, ContainsRegex("(^|\n)job +resnet\n"));
  EXPECT_THAT(text, ContainsRegex("\nstate +running\n"));
  EXPECT_THAT(text, ContainsRegex("\nround +3 \\(closed 4m ago\\)\n"));
  EXPECT_THAT(text, ContainsRegex(
                        "\nworld size +4 \\(nodes 2:4 x 2 process\\(es\\) per "
                        "node\\)\n"));
  EXPECT_THAT(text, ContainsRegex("\nbackend +nccl \\(preference auto\\)\n"));
  EXPECT_THAT(text, HasSubstr("(3h ago)"));
  EXPECT_THAT(text, Not(HasSubstr("reason")));

  EXPECT_THAT(text, HasSubstr("\nmembers (round 3):\n"));
  EXPECT_THAT(text, ContainsRegex("\nRANK +NODE +HOST +PID +STATE +STEP +"
                                  "SAMPLES/S +STEP TIME +COMM TIME +LAG +"
                                  "LAST SEEN\n"));
  // No heartbeats yet: the training columns are dashes.
  EXPECT_THAT(text, ContainsRegex("\n0 +0 +host-a +101 +active +- +- +- +- +- "
                                  "+5s ago\n"));
  EXPECT_THAT(text, ContainsRegex("\n1 +0 +host-a +102 +active +- +- +- +- +- "
                                  "+5s ago\n"));
  EXPECT_THAT(text, ContainsRegex("\n2 +1 +host-b +201 +active +- +- +- +- +- "
                                  "+7s ago\n"));
  EXPECT_THAT(text, ContainsRegex("\n3 +1 +host-b +202 +active +- +- +- +- +- "
                                  "+7s ago\n"));
  EXPECT_THAT(text, Not(HasSubstr("diagnosis:")));

  // The spare is listed in its own section, without ranks.
  EXPECT_THAT(text, HasSubstr("\nspares:\n"));
  EXPECT_THAT(
      text,
      ContainsRegex("\n- +- +- +gpu-c +host-c +301 +cuda:8 +spare +42s ago\n"));
  EXPECT_THAT(text, Not(HasSubstr("waiting for the next round")));
  // Sections come in order: summary, members, spares.
  EXPECT_LT(text.find("members (round 3)"), text.find("spares:"));
}

TEST(FormatJobStatusTest, APartialListingSaysSoAndTheSummaryCounts) {
  v1::JobStatus job = RunningJob();  // world size 4
  job.mutable_members()->DeleteSubrange(1, 3);  // one member listed
  v1::JobSummary* s = job.mutable_summary();
  s->set_active(3);
  s->set_lost(1);
  s->set_heard(4);
  s->set_min_step(120);
  s->set_max_step(131);
  s->set_stragglers(1);
  s->set_matching(1);
  v1::SlowRank* slow = s->add_slowest();
  slow->set_rank(2);
  *slow->mutable_lag() = ToProtoDuration(absl::Milliseconds(250));
  std::string text = FormatJobStatus(job, kNow);
  EXPECT_THAT(text, ContainsRegex(
                        "\nmembers +3 active, 1 lost, 0 exited; 4 of 4 heard "
                        "from\n"));
  EXPECT_THAT(text, ContainsRegex("\nsteps +120 to 131\n"));
  EXPECT_THAT(text, ContainsRegex(
                        "\nslowest +rank 2 \\+250ms \\(1 flagged as "
                        "stragglers\\)\n"));
  EXPECT_THAT(text, HasSubstr("\nmembers (round 3, 1 of the 1 selected):\n"));
}

TEST(FormatJobStatusTest, AListingThatSelectedNoMemberSaysSo) {
  v1::JobStatus job = RunningJob();  // world size 4, all healthy
  job.clear_members();
  job.mutable_summary()->set_active(4);
  job.mutable_summary()->set_heard(4);
  std::string text = FormatJobStatus(job, kNow);
  EXPECT_THAT(text, HasSubstr("\nmembers (round 3): none of those selected"));
  EXPECT_THAT(text, HasSubstr("--all lists every member"));
  // Without a summary (a whole status) there is nothing to say.
  job.clear_summary();
  EXPECT_THAT(FormatJobStatus(job, kNow), Not(HasSubstr("none of those")));
}

TEST(FormatJobStatusTest, WaitingJobShowsWaitingProcessesAndNoMembers) {
  std::string text = FormatJobStatus(WaitingJob(), kNow);
  EXPECT_THAT(text, ContainsRegex("\nstate +waiting\n"));
  EXPECT_THAT(text, ContainsRegex("\nround +none closed yet\n"));
  EXPECT_THAT(text, ContainsRegex("\nbackend +- \\(preference gloo\\)\n"));
  EXPECT_THAT(text, Not(HasSubstr("members (round")));
  EXPECT_THAT(text, Not(HasSubstr("spares:")));
  EXPECT_THAT(text, HasSubstr("\nwaiting for the next round:\n"));
  EXPECT_THAT(
      text,
      ContainsRegex("\n- +- +- +cpu-1 +host-1 +11 +cpu:1 +waiting +20s ago\n"));
  EXPECT_THAT(
      text,
      ContainsRegex("\n- +- +- +cpu-2 +host-2 +12 +cpu:1 +waiting +2m ago\n"));
  // Join order is kept.
  EXPECT_LT(text.find("cpu-1"), text.find("cpu-2"));
}

TEST(FormatJobStatusTest, ReasonIsShownWhenSet) {
  v1::JobStatus job = RunningJob();
  job.set_state(v1::JOB_STATE_WAITING);
  job.set_reason("rank 2 rejoined after round 3");
  EXPECT_THAT(FormatJobStatus(job, kNow),
              ContainsRegex("\nreason +rank 2 rejoined after round 3\n"));
}

// RunningJob() after heartbeats: rank 1 is slow and lost, rank 3 lags.
v1::JobStatus MonitoredJob() {
  v1::JobStatus job = RunningJob();
  for (int r = 0; r < 4; ++r) {
    v1::WorkerMetrics* w = job.mutable_members(r)->mutable_metrics();
    w->set_state(v1::WORKER_STATE_TRAINING);
    w->set_step(1200 + r);
    w->set_samples_per_second(2048.5);
    w->mutable_step_timings()->set_step_seconds(0.25);
    w->mutable_step_timings()->set_communication_seconds(0.004);
    w->set_rss_bytes(int64_t{2} << 30);
    v1::BucketStats* b = w->add_buckets();
    b->set_index(0);
    b->set_bytes(1 << 20);
    b->set_allreduce_seconds(0.002);
    b->set_algbw_bytes_per_second(5.0e8);
  }
  job.set_state(v1::JOB_STATE_DEGRADED);
  job.set_reason("rank 1 (host-a) lost: missed 3 heartbeats");
  job.mutable_members(1)->set_state(v1::MEMBER_STATE_LOST);
  job.mutable_members(1)->set_state_reason("missed 3 heartbeats (every 1s)");
  *job.mutable_members(3)->mutable_lag() = ToProtoDuration(absl::Milliseconds(300));
  v1::JobDiagnosis* d = job.mutable_diagnosis();
  d->set_hang("ranks 0,2,3 finished collective #183; rank 1 finished #182 "
              "and has not started #183 (no collective finished for 31s)");
  v1::Straggler* s = d->add_stragglers();
  s->set_rank(3);
  *s->mutable_lag() = ToProtoDuration(absl::Milliseconds(300));
  s->set_steps(8);
  return job;
}

TEST(FormatJobStatusTest, MonitoredJobShowsTrainingColumnsAndDiagnosis) {
  std::string text = FormatJobStatus(MonitoredJob(), kNow);
  EXPECT_THAT(text, ContainsRegex("\nstate +degraded\n"));
  EXPECT_THAT(text, ContainsRegex("\n0 +0 +host-a +101 +active +1200 +2048.5 "
                                  "+250ms +4.0ms +- +5s ago\n"));
  EXPECT_THAT(text, ContainsRegex("\n1 +0 +host-a +102 +lost +1201 +2048.5 "
                                  "+250ms +4.0ms +- +5s ago\n"));
  EXPECT_THAT(text, ContainsRegex("\n3 +1 +host-b +202 +active +1203 +2048.5 "
                                  "+250ms +4.0ms +300ms +7s ago\n"));
  EXPECT_THAT(text, HasSubstr("\ndiagnosis:\n"));
  EXPECT_THAT(text, ContainsRegex("\nhang +ranks 0,2,3 finished collective "
                                  "#183; rank 1 finished #182 and has not "
                                  "started #183"));
  EXPECT_THAT(text, ContainsRegex("\nstraggler +rank 3 is 300ms late to its "
                                  "first gradient bucket \\(median of 8 "
                                  "steps\\)\n"));
  EXPECT_THAT(text, ContainsRegex("\nrank 1 +lost: missed 3 heartbeats "
                                  "\\(every 1s\\)\n"));
  EXPECT_LT(text.find("members (round 3)"), text.find("diagnosis:"));
}

// MonitoredJob with the stacks its hang verdict asked of rank 1 (behind)
// and rank 0 (ahead).
v1::JobStatus HungJobWithStacks() {
  v1::JobStatus job = MonitoredJob();
  v1::HangStacks* h = job.mutable_diagnosis()->mutable_hang_stacks();
  h->add_hung_ranks(1);
  h->set_healthy_rank(0);
  h->add_answered(0);
  h->add_answered(1);
  v1::StackGroup* hung = h->add_groups();
  hung->add_ranks(1);
  hung->set_threads(1);
  hung->add_thread_names("gradsync-worker");
  hung->add_frames("gradsync::HealthReporter::AwaitRoundOver()");
  hung->add_frames("gradsync::TrainingRun::Impl::MaybeHang()");
  hung->set_hung_only(true);
  v1::StackGroup* shared = h->add_groups();
  shared->add_ranks(0);
  shared->add_ranks(1);
  shared->set_threads(4);
  shared->add_thread_names("grpc_global_tim");
  for (const char* f : {"syscall", "absl::Mutex::Block()", "?? (libgrpc.so+0x10)",
                        "PollerLoop", "start_thread"}) {
    shared->add_frames(f);
  }
  v1::StackGroup* ahead = h->add_groups();
  ahead->add_ranks(0);
  ahead->set_threads(1);
  ahead->add_thread_names("gradsync-worker");
  ahead->add_frames("gradsync::Work::Wait()");
  h->add_errors("rank 0: thread 12 did not answer within 200ms");
  return job;
}

TEST(FormatJobStatusTest, ARebalanceShowsInTheDiagnosisAndTheJson) {
  v1::JobStatus job = MonitoredJob();
  v1::Rebalance* r = job.mutable_diagnosis()->mutable_rebalance();
  r->set_round(3);
  r->add_shares(11);
  r->add_shares(10);
  r->add_shares(3);
  r->set_verdict("rank 2 takes 3.0x as long per micro-batch as rank 0");
  EXPECT_THAT(FormatJobStatus(job, kNow),
              ContainsRegex("\nrebalanced +round 3: rank 2 takes 3.0x as long "
                            "per micro-batch as rank 0\n"));
  nlohmann::json j = nlohmann::json::parse(JobStatusToJson(job));
  EXPECT_EQ(j["diagnosis"]["rebalance"]["shares"],
            nlohmann::json::array({11, 10, 3}));
  EXPECT_EQ(j["diagnosis"]["rebalance"]["round"], 3);
  EXPECT_TRUE(nlohmann::json::parse(JobStatusToJson(MonitoredJob()))
                  ["diagnosis"]["rebalance"].is_null());
}

TEST(FormatJobStatusTest, HangStacksShowWhatOnlyTheHungRanksDo) {
  const std::string text = FormatJobStatus(HungJobWithStacks(), kNow);
  EXPECT_THAT(text, HasSubstr("\nstacks (asked rank 1 behind and rank 0 ahead "
                              "for contrast; answered: 0,1):\n"
                              "  rank 1, 1 thread (gradsync-worker), behind only:\n"
                              "      gradsync::HealthReporter::AwaitRoundOver()\n"
                              "      gradsync::TrainingRun::Impl::MaybeHang()\n"
                              "  rank 0, 1 thread (gradsync-worker), ahead only:\n"
                              "      gradsync::Work::Wait()\n"
                              "  on both sides:\n"
                              "    ranks 0,1, 4 threads (grpc_global_tim) in "
                              "PollerLoop\n"
                              "  rank 0: thread 12 did not answer within 200ms\n"));
  EXPECT_LT(text.find("diagnosis:"), text.find("stacks (asked"));
  EXPECT_THAT(FormatJobStatus(MonitoredJob(), kNow),
              Not(HasSubstr("stacks (asked")));
}

TEST(JobStatusToJsonTest, HangStacksAreInTheJsonWhole) {
  nlohmann::json j = nlohmann::json::parse(JobStatusToJson(HungJobWithStacks()));
  const nlohmann::json& h = j["diagnosis"]["hang_stacks"];
  EXPECT_EQ(h["hung_ranks"], nlohmann::json::array({1}));
  EXPECT_EQ(h["healthy_rank"], 0);
  ASSERT_EQ(h["groups"].size(), 3u);
  EXPECT_EQ(h["groups"][1]["frames"].size(), 5u);
  EXPECT_EQ(h["groups"][0]["hung_only"], true);
  EXPECT_EQ(h["groups"][1]["ranks"], nlohmann::json::array({0, 1}));
  EXPECT_TRUE(nlohmann::json::parse(JobStatusToJson(MonitoredJob()))
                  ["diagnosis"]["hang_stacks"].is_null());
}

TEST(FormatJobStatusTest, EndedJobShowsWhenItEnded) {
  v1::JobStatus job = RunningJob();
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  *job.mutable_end_time() = ToProtoTime(kNow - absl::Minutes(2));
  EXPECT_THAT(FormatJobStatus(job, kNow),
              ContainsRegex("\nended +2023-11-14T22:11:20(Z|\\+00:00) "
                            "\\(2m ago\\)\n"));
}

// A job that recovered once: round 2 lost rank 1 and round 3 re-formed.
v1::JobStatus RecoveredJob() {
  v1::JobStatus job = RunningJob();
  v1::Recovery* r = job.add_recoveries();
  r->set_failed_round(2);
  r->set_new_round(3);
  r->set_cause("rank 1 (host-a) lost: heartbeat stream broke");
  r->set_old_world_size(4);
  r->set_new_world_size(4);
  r->set_resumed_in_place(true);
  r->set_resume_step(1200);
  r->set_source_rank(2);
  *r->mutable_detect_time() = ToProtoTime(kNow - absl::Minutes(5));
  *r->mutable_round_close_time() = ToProtoTime(kNow - absl::Minutes(4));
  *r->mutable_detection() = ToProtoDuration(absl::Milliseconds(0));
  *r->mutable_rendezvous() = ToProtoDuration(absl::Milliseconds(35));
  *r->mutable_round_start()->mutable_process_group() =
      ToProtoDuration(absl::Milliseconds(49));
  *r->mutable_round_start()->mutable_state_transfer() =
      ToProtoDuration(absl::Milliseconds(12));
  *r->mutable_round_start()->mutable_first_step() =
      ToProtoDuration(absl::Milliseconds(20));
  r->set_round_start_reports(4);
  job.set_recovery_count(1);
  return job;
}

TEST(FormatJobStatusTest, RecoveriesAreListedNewestFirst) {
  v1::JobStatus job = RecoveredJob();
  EXPECT_THAT(FormatJobStatus(RunningJob(), kNow), Not(HasSubstr("recoveries")));
  const std::string text = FormatJobStatus(job, kNow);
  EXPECT_THAT(text, HasSubstr("\nrecoveries (1 in all):\nROUNDS"));
  EXPECT_THAT(text, ContainsRegex("2 -> 3 +4 -> 4 +after step 1200 from rank 2 "
                                  "+- +35ms +49ms +12ms +20ms +5m ago +rank 1 "
                                  "\\(host-a\\) lost"));
}

// A PyTorch script's processes restarted by their agents: nothing resumed
// in place, so no "after step 0 from rank 0".
TEST(FormatJobStatusTest, ARecoveryWithoutStateSaysTheProcessesRestarted) {
  v1::JobStatus job = RecoveredJob();
  v1::Recovery* r = job.mutable_recoveries(0);
  r->set_resumed_in_place(false);
  r->set_resume_step(0);
  r->set_source_rank(0);
  const std::string text = FormatJobStatus(job, kNow);
  EXPECT_THAT(text, ContainsRegex("2 -> 3 +4 -> 4 +no: processes restarted +"));
  EXPECT_THAT(text, Not(HasSubstr("after step")));
  nlohmann::json j = nlohmann::json::parse(JobStatusToJson(job));
  EXPECT_EQ(j["recoveries"][0]["resumed_in_place"], false);
}

TEST(JobStatusToJsonTest, RecoveriesAreInTheJson) {
  nlohmann::json j = nlohmann::json::parse(JobStatusToJson(RecoveredJob()));
  EXPECT_EQ(j["recovery_count"], 1);
  ASSERT_EQ(j["recoveries"].size(), 1u);
  EXPECT_EQ(j["recoveries"][0]["resumed_in_place"], true);
  EXPECT_EQ(j["recoveries"][0]["resume_step"], 1200);
  EXPECT_EQ(j["recoveries"][0]["source_rank"], 2);
  EXPECT_DOUBLE_EQ(j["recoveries"][0]["rendezvous_seconds"].get<double>(), 0.035);
  EXPECT_DOUBLE_EQ(j["recoveries"][0]["process_group_seconds"].get<double>(),
                   0.049);
  EXPECT_EQ(j["recoveries"][0]["round_start_reports"], 4);
}

TEST(JobStatusToJsonTest, MonitoredJobHasMetricsAndDiagnosis) {
  nlohmann::json j = nlohmann::json::parse(JobStatusToJson(MonitoredJob()));
  EXPECT_EQ(j["state"], "degraded");
  EXPECT_THAT(j["diagnosis"]["hang"].get<std::string>(),
              HasSubstr("rank 1 finished #182"));
  EXPECT_EQ(j["diagnosis"]["desync"], "");
  ASSERT_EQ(j["diagnosis"]["stragglers"].size(), 1u);
  EXPECT_EQ(j["diagnosis"]["stragglers"][0]["rank"], 3);
  EXPECT_DOUBLE_EQ(j["diagnosis"]["stragglers"][0]["lag_seconds"], 0.3);
  const nlohmann::json& m1 = j["members"][1];
  EXPECT_EQ(m1["state"], "lost");
  EXPECT_EQ(m1["state_reason"], "missed 3 heartbeats (every 1s)");
  EXPECT_EQ(m1["worker_state"], "training");
  EXPECT_EQ(m1["step"], 1201);
  EXPECT_DOUBLE_EQ(m1["samples_per_second"], 2048.5);
  EXPECT_DOUBLE_EQ(m1["step_seconds"], 0.25);
  EXPECT_DOUBLE_EQ(m1["communication_seconds"], 0.004);
  EXPECT_EQ(m1["rss_bytes"], int64_t{2} << 30);
  ASSERT_EQ(m1["buckets"].size(), 1u);
  EXPECT_EQ(m1["buckets"][0]["bytes"], 1 << 20);
  EXPECT_DOUBLE_EQ(j["members"][3]["lag_seconds"], 0.3);
  // One line per document for `watch --json`.
  std::string line = JobStatusToJsonLine(MonitoredJob());
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
  EXPECT_EQ(nlohmann::json::parse(line), j);
}

TEST(FormatJobStatusTest, CreatedShowsRfc3339AndAge) {
  std::string text = FormatJobStatus(RunningJob(), kNow);
  EXPECT_THAT(text, ContainsRegex("\ncreated +2023-11-14T19:13:20(Z|\\+00:00) "
                                  "\\(3h ago\\)\n"));
}

// ---------------------------------------------------------------------------
// JSON

TEST(JobsToJsonTest, ListsSummariesWithRequiredFields) {
  std::string text = JobsToJson({WaitingJob(), RunningJob()});
  nlohmann::json j = nlohmann::json::parse(text);  // throws on bad JSON
  ASSERT_TRUE(j.is_object());
  ASSERT_TRUE(j.contains("jobs"));
  ASSERT_TRUE(j["jobs"].is_array());
  ASSERT_EQ(j["jobs"].size(), 2u);

  const nlohmann::json& bert = j["jobs"][0];
  EXPECT_EQ(bert["job"], "bert");
  EXPECT_EQ(bert["state"], "waiting");
  EXPECT_EQ(bert["round"], 0);
  EXPECT_EQ(bert["world_size"], 0);
  EXPECT_EQ(bert["backend"], "-");
  EXPECT_EQ(bert["backend_preference"], "gloo");
  EXPECT_EQ(bert["min_nodes"], 3);
  EXPECT_EQ(bert["max_nodes"], 3);
  EXPECT_EQ(bert["round_closed"], "");

  const nlohmann::json& resnet = j["jobs"][1];
  EXPECT_EQ(resnet["job"], "resnet");
  EXPECT_EQ(resnet["state"], "running");
  EXPECT_EQ(resnet["round"], 3);
  EXPECT_EQ(resnet["world_size"], 4);
  EXPECT_EQ(resnet["backend"], "nccl");
  EXPECT_EQ(resnet["backend_preference"], "auto");
  EXPECT_EQ(resnet["min_nodes"], 2);
  EXPECT_EQ(resnet["max_nodes"], 4);
  EXPECT_EQ(resnet["nproc_per_node"], 2);
  EXPECT_THAT(resnet["created"].get<std::string>(),
              StartsWith("2023-11-14T19:13:20"));
  // The list is a summary: no member lists.
  EXPECT_FALSE(resnet.contains("members"));
}

TEST(JobsToJsonTest, EmptyListIsAnEmptyArray) {
  nlohmann::json j = nlohmann::json::parse(JobsToJson({}));
  ASSERT_TRUE(j["jobs"].is_array());
  EXPECT_TRUE(j["jobs"].empty());
}

TEST(JobStatusToJsonTest, RunningJobHasSummaryAndMembers) {
  std::string text = JobStatusToJson(RunningJob());
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["job"], "resnet");
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["round"], 3);
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["backend"], "nccl");
  EXPECT_EQ(j["reason"], "");

  ASSERT_TRUE(j["members"].is_array());
  ASSERT_EQ(j["members"].size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const nlohmann::json& m = j["members"][r];
    SCOPED_TRACE(m.dump());
    EXPECT_EQ(m["rank"], r);
    EXPECT_EQ(m["local_rank"], r % 2);
    EXPECT_EQ(m["node_rank"], r / 2);
    EXPECT_EQ(m["host"], r < 2 ? "host-a" : "host-b");
    EXPECT_EQ(m["node"], r < 2 ? "gpu-a" : "gpu-b");
    EXPECT_EQ(m["state"], "active");
    EXPECT_EQ(m["device"], "cuda");
    EXPECT_EQ(m["device_count"], 8);
    ASSERT_TRUE(m["addresses"].is_array());
    EXPECT_EQ(m["addresses"].size(), 1u);
    EXPECT_THAT(m["last_seen"].get<std::string>(), StartsWith("2023-11-14T"));
  }
  EXPECT_EQ(j["members"][2]["pid"], 201);

  ASSERT_TRUE(j["waiting"].is_array());
  EXPECT_TRUE(j["waiting"].empty());
  ASSERT_TRUE(j["spares"].is_array());
  ASSERT_EQ(j["spares"].size(), 1u);
  EXPECT_EQ(j["spares"][0]["rank"], -1);
  EXPECT_EQ(j["spares"][0]["host"], "host-c");
  EXPECT_EQ(j["spares"][0]["state"], "spare");
}

TEST(JobStatusToJsonTest, WaitingJobListsWaitingProcesses) {
  nlohmann::json j = nlohmann::json::parse(JobStatusToJson(WaitingJob()));
  EXPECT_EQ(j["job"], "bert");
  EXPECT_EQ(j["state"], "waiting");
  EXPECT_EQ(j["round"], 0);
  EXPECT_EQ(j["world_size"], 0);
  ASSERT_TRUE(j["members"].is_array());
  EXPECT_TRUE(j["members"].empty());
  ASSERT_EQ(j["waiting"].size(), 2u);
  EXPECT_EQ(j["waiting"][0]["host"], "host-1");
  EXPECT_EQ(j["waiting"][1]["host"], "host-2");
  for (const auto& m : j["waiting"]) {
    EXPECT_EQ(m["rank"], -1);
    EXPECT_EQ(m["state"], "waiting");
    EXPECT_EQ(m["device"], "cpu");
  }
  EXPECT_TRUE(j["spares"].empty());
}

TEST(JobStatusToJsonTest, EscapesAwkwardStrings) {
  v1::JobStatus job = RunningJob();
  job.set_reason("quote \" backslash \\ newline \n tab \t");
  job.mutable_members(0)->mutable_node()->set_hostname("h\"ost");
  nlohmann::json j = nlohmann::json::parse(JobStatusToJson(job));
  EXPECT_EQ(j["reason"], "quote \" backslash \\ newline \n tab \t");
  EXPECT_EQ(j["members"][0]["host"], "h\"ost");
}

TEST(JobStatusToJsonTest, OutputEndsWithANewline) {
  std::string text = JobStatusToJson(RunningJob());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_THAT(JobsToJson({}), AllOf(StartsWith("{"), HasSubstr("\"jobs\"")));
}

}  // namespace
}  // namespace gradsync
