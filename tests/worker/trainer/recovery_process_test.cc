// In-place recovery with real processes: gradsync-workers and a real
// coordinator, over shared memory, over Gloo's TCP, and through the GPU path
// on simulated devices (--device=sim: the NCCL backend over the simulated
// NCCL). A rank is killed with SIGKILL at a random step; the survivors never
// exit:
//  - with a spare waiting, the spare takes the lost rank, the world size
//    stays 3, and the final parameters equal those of an uninterrupted
//    3-rank run of the same config (relative error <= 1e-5);
//  - without one (--nnodes=2:3), the job goes on at world size 2, and the
//    sample logs show every sample of every epoch used exactly once across
//    ranks and rounds.
// On the simulated GPUs also: an NCCL collective that fails asynchronously
// after the host moved on, and one that hangs, are healed without applying
// the failed step (the final parameters equal an uninterrupted run's); and
// processes keep their devices through a replacement, no two on one.
// The runs whose global batch is divided otherwise than the reference's
// (a rebalance, a shrink and a grow) train in double precision
// (--float64): in single precision the two sum their gradients in another
// order, and 1 rebalanced run in 8 here (and 2 in CI) ended 1.3e-3 apart
// from the reference (the same figure each time), with the same samples in
// every step and the parameters' sums parting by 1e-6 in the middle of a
// round, never by 1e-4: the mark of a rounding difference that a ReLU
// near zero turned into another trajectory, not of a step lost or repeated.
#include <signal.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "common/failpoint.h"
#include "common/job_config.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"
#include "tests/worker/ddp/state_compare.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::PumpUntil;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::TempPath;
using ::gradsync::testing::WaitAll;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kBound = absl::Seconds(120);

// One worker process of a job, with its sample and step logs.
struct Worker {
  std::unique_ptr<Child> child = std::make_unique<Child>();
  std::string sample_log;
  std::string step_log;
};

// Where `job`'s parameters parted from `reference`'s, from the step logs
// (the sum of the parameters' absolute values after each step; per step,
// the latest round's line): the first step whose sums differ by more than
// 1e-6 and 1e-4 relative, with its round in the job.
std::string WherePartedFrom(const std::vector<Worker>& job,
                            const std::vector<Worker>& reference);

// Checks that `job`'s workers trained each step on the samples
// `reference`'s did (per step, the lines of the latest round that ran it,
// from the sample logs): a run compared with an uninterrupted one must
// differ from it only in rounding, never in its data.
void ExpectSameSamplesEachStep(const std::vector<Worker>& job,
                               const std::vector<Worker>& reference);

// How the ranks communicate.
enum class Transport { kSharedMemory, kGloo, kSimulatedGpu };

class RecoveryProcessTest : public ::testing::TestWithParam<Transport> {
 protected:
  static void SetUpTestSuite() {
    coordinator_ = new CoordinatorProcess();
    ASSERT_TRUE(coordinator_->Start(Runfile("server/gradsync-coordinator"),
                                    "recovery_process_test"));
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(coordinator_->Stop());
    delete coordinator_;
    coordinator_ = nullptr;
  }

  std::string Job(const std::string& base) const {
    switch (GetParam()) {
      case Transport::kSharedMemory:
        return base + "-shm";
      case Transport::kGloo:
        return base + "-gloo";
      case Transport::kSimulatedGpu:
        break;
    }
    return base + "-sim";
  }
  std::string TransportFlag() const {
    switch (GetParam()) {
      case Transport::kSharedMemory:
        return "--shared_memory=true";
      case Transport::kGloo:
        return "--shared_memory=false";
      case Transport::kSimulatedGpu:
        break;
    }
    return "--device=sim";
  }

  // Model, data and optimizer flags shared by the workers and the reference:
  // `model` (an MLP unless given), then the rest.
  static std::vector<std::string> ModelFlags(
      std::vector<std::string> model = {"--model=mlp", "--hidden=24"}) {
    model.insert(model.end(), {"--dataset=synthetic", "--lr=0.1",
                               "--momentum=0.5", "--seed=7", "--threads=1"});
    return model;
  }

  // Starts worker `index` of `job` as its own node ("n<index>"), or on
  // node `node` when given.
  void StartWorker(const std::string& job, int index, const std::string& nnodes,
                   const std::vector<std::string>& flags,
                   const std::string& node = "") {
    Worker& w = workers_.emplace_back();
    w.sample_log = TempPath(absl::StrCat(job, "-", index, ".samples"));
    w.step_log = TempPath(absl::StrCat(job, "-", index, ".steps"));
    std::vector<std::string> argv = {
        Runfile("worker/gradsync-worker"),
        absl::StrCat("--coordinator=", coordinator_->address()),
        absl::StrCat("--job=", job), absl::StrCat("--nnodes=", nnodes),
        node.empty() ? absl::StrCat("--node_id=n", index)
                     : absl::StrCat("--node_id=", node),
        "--timeout=20s", "--join_timeout=60s", "--last_call_timeout=30s",
        "--log_every=1", TransportFlag(),
        absl::StrCat("--sample_log=", w.sample_log),
        absl::StrCat("--step_log=", w.step_log)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ASSERT_TRUE(w.child->Start(argv, /*capture=*/true));
  }

  std::vector<Child*> Children() const {
    std::vector<Child*> children;
    for (const Worker& w : workers_) children.push_back(w.child.get());
    return children;
  }

  // The worker that got rank `rank` of `world` in round `round`, once
  // known.
  Worker* RankInRound(int64_t round, int rank, int world) {
    const std::string line = absl::StrCat("rank ", rank, " of ", world,
                                          " (node ");
    const std::string round_text = absl::StrCat(", round ", round, ",");
    for (Worker& w : workers_) {
      const std::string& out = w.child->out();
      for (size_t at = out.find(line); at != std::string::npos;
           at = out.find(line, at + 1)) {
        if (out.compare(out.find(", round ", at), round_text.size(),
                        round_text) == 0) {
          return &w;
        }
      }
    }
    return nullptr;
  }

  // Waits until rank 0 of round `round` reports step `step` in that round,
  // then kills the process holding rank `victim` with SIGKILL; returns it.
  Worker* KillAtStep(int64_t round, int victim, int world, int step) {
    Worker* rank0 = nullptr;
    Worker* killed = nullptr;
    const std::string progress = absl::StrCat("step ", step, "/");
    const std::string round_line = absl::StrCat(", round ", round, ",");
    EXPECT_TRUE(PumpUntil(Children(), kBound, [&] {
      rank0 = RankInRound(round, 0, world);
      killed = RankInRound(round, victim, world);
      if (rank0 == nullptr || killed == nullptr) return false;
      const std::string& out = rank0->child->out();
      return out.find(progress, out.find(round_line)) != std::string::npos;
    })) << Describe();
    if (killed != nullptr) killed->child->Signal(SIGKILL);
    return killed;
  }

  v1::JobStatus JobStatus(const std::string& job) {
    ClientOptions options;
    options.target = coordinator_->address();
    auto client = GrpcCoordinatorClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    absl::StatusOr<v1::JobStatus> status = (*client)->GetJob(job);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::JobStatus();
  }

  // The `killed` workers died of SIGKILL; every other one exits 0 as a
  // member of round `last_round`.
  void ExpectSurvivorsSucceeded(const std::vector<Worker*>& killed,
                                int64_t last_round) {
    ASSERT_TRUE(WaitAll(Children(), kBound)) << Describe();
    for (const Worker& w : workers_) {
      if (std::find(killed.begin(), killed.end(), &w) != killed.end()) {
        EXPECT_TRUE(w.child->killed_by(SIGKILL)) << w.child->describe();
        continue;
      }
      EXPECT_EQ(w.child->exit_code(), 0) << w.child->describe();
      EXPECT_THAT(w.child->out(),
                  HasSubstr(absl::StrCat(", round ", last_round, ", backend")))
          << w.child->describe();
    }
  }

  // A job whose final parameters are compared with those of a reference:
  // the same config, 3 ranks, no failure, run alongside.
  struct ComparedRun {
    std::string params;            // the job's, saved by rank 0
    std::string reference_params;  // the reference's
    std::vector<Worker> reference;
    // The job's workers' flags (model, data, --save_params=params).
    std::vector<std::string> flags;
  };

  // Starts the reference of job `job` (as job "<job>-reference"), with
  // `config` (data and steps) after the model flags (ModelFlags(model)).
  ComparedRun StartReference(
      const std::string& job,
      const std::vector<std::string>& config = {
          "--synthetic_size=96", "--steps=300", "--batch_size=4",
          "--max_recoveries=2"},
      const std::vector<std::string>& model = {"--model=mlp", "--hidden=24"}) {
    ComparedRun run;
    run.params = TempPath(job + "-ddp.pt");
    run.reference_params = TempPath(job + "-reference.pt");
    std::vector<std::string> flags = ModelFlags(model);
    flags.insert(flags.end(), config.begin(), config.end());
    run.flags = flags;
    run.flags.push_back(absl::StrCat("--save_params=", run.params));
    flags.push_back(absl::StrCat("--save_params=", run.reference_params));
    for (int i = 0; i < 3; ++i) StartWorker(job + "-reference", i, "3", flags);
    run.reference = std::move(workers_);
    workers_.clear();
    return run;
  }

  // Waits for `run`'s reference to succeed, then compares the parameters the job saved with the reference's, and the
  // samples each step trained on.
  void ExpectSameParametersAsTheReference(ComparedRun* run) {
    const std::vector<Worker> job = std::move(workers_);
    workers_ = std::move(run->reference);
    ASSERT_TRUE(WaitAll(Children(), kBound)) << Describe();
    for (const Worker& w : workers_) {
      ASSERT_EQ(w.child->exit_code(), 0) << w.child->describe();
    }
    std::string worst;
    absl::StatusOr<double> error =
        MaxRelativeError(run->params, run->reference_params, &worst);
    ASSERT_TRUE(error.ok()) << error.status();
    std::cout << "relative error against the reference: " << *error << " ("
              << worst << "); " << WherePartedFrom(job, workers_) << "\n";
    // In double precision rounding is some 1e-15 here.
    const bool float64 = absl::c_linear_search(run->flags, "--float64");
    EXPECT_LE(*error, float64 ? 1e-9 : 1e-5) << worst;
    ExpectSameSamplesEachStep(job, workers_);
  }

  std::string Describe() const {
    std::string all;
    for (const Worker& w : workers_) absl::StrAppend(&all, w.child->describe(), "\n");
    return all;
  }

  // The kill's step and victim, drawn at random (and logged).
  static int RandomStep(int low, int high) {
    std::random_device device;
    const int step = std::uniform_int_distribution<int>(low, high)(device);
    std::cerr << "killing when rank 0 reports step " << step << "\n";
    return step;
  }
  // A rank in [low, high], drawn at random; `what` is logged with it.
  static int RandomRank(int low = 0, int high = 2,
                        const char* what = "killing rank") {
    std::random_device device;
    const int rank = std::uniform_int_distribution<int>(low, high)(device);
    std::cerr << what << " " << rank << "\n";
    return rank;
  }

  // 3 members and a spare; one member is killed at a random step: the
  // spare takes its place and the result is the uninterrupted run's.
  void ExpectSpareReplacesAKilledRank();
  // An exact global batch through a shrink and a grow (below).
  void ExpectGlobalBatchExactThroughAShrinkAndAGrow();
  // A replica corrupted by a flipped bit is found and healed (below).
  void ExpectACorruptedReplicaIsHealed();
  // A straggler's micro-batches move to the others (below).
  void ExpectAStragglerRebalanced();

  static CoordinatorProcess* coordinator_;
  std::vector<Worker> workers_;
};

CoordinatorProcess* RecoveryProcessTest::coordinator_ = nullptr;

TEST_P(RecoveryProcessTest, SpareReplacesAKilledRankWithoutChangingTheResult) {
  ExpectSpareReplacesAKilledRank();
}

void RecoveryProcessTest::ExpectSpareReplacesAKilledRank() {
  const std::string job = Job("spare");
  ComparedRun run = StartReference(job);
  // 3 members and a spare (the fourth to join).
  for (int i = 0; i < 4; ++i) StartWorker(job, i, "3", run.flags);

  Worker* killed = KillAtStep(1, RandomRank(), 3, RandomStep(10, 120));
  ASSERT_NE(killed, nullptr);
  ExpectSurvivorsSucceeded({killed}, 2);
  v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 2);
  EXPECT_EQ(status.world_size(), 3);
  // Every member of round 2 reported how its start went.
  ASSERT_EQ(status.recoveries_size(), 1);
  const v1::Recovery& recovery = status.recoveries(0);
  EXPECT_EQ(recovery.round_start_reports(), 3);
  EXPECT_GT(FromProtoDuration(recovery.round_start().process_group()),
            absl::ZeroDuration());
  EXPECT_GT(FromProtoDuration(recovery.round_start().state_transfer()),
            absl::ZeroDuration());
  EXPECT_GT(FromProtoDuration(recovery.round_start().first_step()),
            absl::ZeroDuration());

  ExpectSameParametersAsTheReference(&run);
}

// A member dies in the middle of the state transfer that starts a round:
// the spare that takes the killed rank's place exits (failpoint) after it
// received the step counters, before the parameters. The others find the
// loss in the transfer, or at the latest in their next collective, re-form
// once more with the second spare, and end with the parameters of an
// uninterrupted run.
TEST_P(RecoveryProcessTest, SurvivesALossDuringTheStateTransfer) {
  const std::string job = Job("transfer");
  ComparedRun run = StartReference(job);
  const std::vector<std::string>& flags = run.flags;
  workers_.reserve(5);  // pointers into it stay valid
  for (int i = 0; i < 3; ++i) StartWorker(job, i, "3", flags);
  Worker* killed = KillAtStep(1, RandomRank(), 3, RandomStep(10, 120));
  ASSERT_NE(killed, nullptr);
  // The survivors wait for a third node (--nnodes=3): the first spare, which
  // dies in round 2's state transfer; then the second.
  std::vector<std::string> failing = flags;
  failing.push_back("--failpoint=state_transfer");
  StartWorker(job, 3, "3", failing);
  ASSERT_TRUE(PumpUntil(Children(), kBound,
                        [&] { return !workers_[3].child->running(); }))
      << Describe();
  StartWorker(job, 4, "3", flags);
  ASSERT_TRUE(WaitAll(Children(), kBound)) << Describe();
  const Worker& failed = workers_[3];
  EXPECT_EQ(failed.child->exit_code(), kFailpointExitCode)
      << failed.child->describe();
  EXPECT_THAT(failed.child->err(), HasSubstr("failpoint state_transfer hit"));
  EXPECT_THAT(failed.child->out(), HasSubstr(", round 2, backend"));
  for (const Worker& w : workers_) {
    if (&w == killed || &w == &failed) continue;
    EXPECT_EQ(w.child->exit_code(), 0) << w.child->describe();
    EXPECT_THAT(w.child->out(), HasSubstr(", round 3, backend"))
        << w.child->describe();
  }
  v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 3);
  EXPECT_EQ(status.world_size(), 3);
  EXPECT_EQ(status.recovery_count(), 2);

  ExpectSameParametersAsTheReference(&run);
}

// One line of a sample log.
struct SampleLine {
  int64_t round = 0, step = 0, epoch = 0;
  std::vector<int64_t> indices;
};

std::vector<SampleLine> ReadSampleLog(const std::string& path) {
  std::vector<SampleLine> lines;
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) {
    std::vector<std::string> fields = absl::StrSplit(text, ' ');
    EXPECT_EQ(fields.size(), 5u) << text;
    if (fields.size() != 5) continue;
    SampleLine line;
    EXPECT_TRUE(absl::SimpleAtoi(fields[0], &line.round) &&
                absl::SimpleAtoi(fields[1], &line.step) &&
                absl::SimpleAtoi(fields[2], &line.epoch));
    for (absl::string_view i : absl::StrSplit(fields[4], ',')) {
      int64_t index = 0;
      EXPECT_TRUE(absl::SimpleAtoi(i, &index)) << text;
      line.indices.push_back(index);
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

// The workers' sample log lines by step: per step, those of the latest
// round that ran it (a step a round did not commit is run again by the
// next).
std::map<int64_t, std::vector<SampleLine>> LatestRoundLines(
    const std::vector<Worker>& workers) {
  std::map<int64_t, std::vector<SampleLine>> by_step;
  for (const Worker& w : workers) {
    for (SampleLine& line : ReadSampleLog(w.sample_log)) {
      std::vector<SampleLine>& lines = by_step[line.step];
      if (!lines.empty() && lines.front().round < line.round) lines.clear();
      if (lines.empty() || lines.front().round == line.round) {
        lines.push_back(std::move(line));
      }
    }
  }
  return by_step;
}

// The samples of each step, from LatestRoundLines.
std::map<int64_t, std::multiset<int64_t>> SamplesByStep(
    const std::vector<Worker>& workers) {
  std::map<int64_t, std::multiset<int64_t>> samples;
  for (const auto& [step, lines] : LatestRoundLines(workers)) {
    for (const SampleLine& line : lines) {
      samples[step].insert(line.indices.begin(), line.indices.end());
    }
  }
  return samples;
}

// Per step: the round of the latest line of the step logs, and its sum.
std::map<int64_t, std::pair<int64_t, double>> StepSums(
    const std::vector<Worker>& workers) {
  std::map<int64_t, std::pair<int64_t, double>> sums;
  for (const Worker& w : workers) {
    std::ifstream in(w.step_log);
    int64_t round = 0, step = 0;
    double loss = 0, sum = 0;
    while (in >> round >> step >> loss >> sum) {
      auto [at, added] = sums.try_emplace(step, round, sum);
      if (!added && at->second.first < round) at->second = {round, sum};
    }
  }
  return sums;
}

std::string WherePartedFrom(const std::vector<Worker>& job,
                            const std::vector<Worker>& reference) {
  const auto mine = StepSums(job);
  const auto theirs = StepSums(reference);
  std::string out = "parameters' sums parted from the reference's";
  for (const double bound : {1e-6, 1e-4}) {
    std::string first = "never";
    for (const auto& [step, round_sum] : mine) {
      const auto at = theirs.find(step);
      if (at == theirs.end()) continue;
      const double a = round_sum.second, b = at->second.second;
      const double diff = std::abs(a - b) / std::max(std::abs(b), 1e-30);
      if (diff > bound) {
        first = absl::StrCat("at step ", step, " (round ", round_sum.first,
                             ", ", diff, ")");
        break;
      }
    }
    absl::StrAppend(&out, ", by ", bound, ": ", first);
  }
  return out;
}

void ExpectSameSamplesEachStep(const std::vector<Worker>& job,
                               const std::vector<Worker>& reference) {
  const std::map<int64_t, std::multiset<int64_t>> mine = SamplesByStep(job);
  const std::map<int64_t, std::multiset<int64_t>> theirs =
      SamplesByStep(reference);
  ASSERT_EQ(mine.size(), theirs.size()) << "steps in the sample logs";
  for (const auto& [step, samples] : theirs) {
    const auto at = mine.find(step);
    ASSERT_TRUE(at != mine.end()) << "step " << step << " missing";
    ASSERT_EQ(at->second, samples)
        << "step " << step << " trained on other samples than the reference's";
  }
}

// Checks the workers' sample logs (LatestRoundLines): every sample of each
// of `epochs` epochs is used once, except that up to `padding` samples may
// repeat in an epoch (a division of an epoch's rest among a new world size
// pads it as PyTorch's sampler does).
void ExpectEverySampleUsedOnce(const std::vector<Worker>& workers, int samples,
                               int epochs, int padding) {
  const std::map<int64_t, std::vector<SampleLine>> by_step =
      LatestRoundLines(workers);
  std::map<int64_t, std::multiset<int64_t>> used;  // epoch -> samples
  for (const auto& [step, lines] : by_step) {
    for (const SampleLine& line : lines) {
      used[line.epoch].insert(line.indices.begin(), line.indices.end());
    }
  }
  ASSERT_EQ(used.size(), static_cast<size_t>(epochs));
  for (const auto& [epoch, used_in_epoch] : used) {
    EXPECT_GE(used_in_epoch.size(), static_cast<size_t>(samples));
    EXPECT_LE(used_in_epoch.size(), static_cast<size_t>(samples + padding))
        << "epoch " << epoch;
    for (int64_t i = 0; i < samples; ++i) {
      ASSERT_GE(used_in_epoch.count(i), 1u) << "sample " << i << " of epoch " << epoch;
      if (padding == 0) {
        ASSERT_EQ(used_in_epoch.count(i), 1u)
            << "sample " << i << " of epoch " << epoch;
      }
    }
  }
}

// The last step any rank started in round `round`, and the first in the
// round after it, from the sample logs (a step's lines are written before
// it runs).
std::pair<int64_t, int64_t> StepsAroundRoundEnd(
    const std::vector<Worker>& workers, int64_t round) {
  int64_t last = 0, next = INT64_MAX;
  for (const Worker& w : workers) {
    for (const SampleLine& line : ReadSampleLog(w.sample_log)) {
      if (line.round == round) last = std::max(last, line.step);
      if (line.round == round + 1) next = std::min(next, line.step);
    }
  }
  return {last, next};
}

TEST_P(RecoveryProcessTest, ShrinksWithoutASpareAndUsesEverySampleOnce) {
  const std::string job = Job("shrink");
  constexpr int kSamples = 960;
  constexpr int kEpochs = 3;
  std::vector<std::string> flags = ModelFlags();
  flags.insert(flags.end(), {absl::StrCat("--synthetic_size=", kSamples),
                             absl::StrCat("--epochs=", kEpochs),
                             "--batch_size=4", "--shuffle"});
  for (int i = 0; i < 3; ++i) StartWorker(job, i, "2:3", flags);
  Worker* killed = KillAtStep(1, RandomRank(), 3, RandomStep(10, 150));
  ASSERT_NE(killed, nullptr);
  ExpectSurvivorsSucceeded({killed}, 2);
  v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 2);
  EXPECT_EQ(status.world_size(), 2);

  ExpectEverySampleUsedOnce(workers_, kSamples, kEpochs, /*padding=*/0);
}

// Two failures in a row, each replaced by a spare; the spare left over is
// turned away once the job succeeds.
TEST_P(RecoveryProcessTest, SurvivesTwoFailuresInARow) {
  const std::string job = Job("twice");
  std::vector<std::string> flags = ModelFlags();
  flags.insert(flags.end(), {"--synthetic_size=96", "--steps=300",
                             "--batch_size=4", "--max_recoveries=2"});
  for (int i = 0; i < 3; ++i) StartWorker(job, i, "3", flags);
  // The spares join once the round runs.
  ASSERT_TRUE(PumpUntil(Children(), kBound,
                        [&] { return RankInRound(1, 2, 3) != nullptr; }));
  for (int i = 3; i < 6; ++i) StartWorker(job, i, "3", flags);
  Worker* first = KillAtStep(1, RandomRank(), 3, RandomStep(10, 60));
  ASSERT_NE(first, nullptr);
  Worker* second = KillAtStep(2, RandomRank(), 3, RandomStep(100, 150));
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(WaitAll(Children(), kBound)) << Describe();
  v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 3);
  EXPECT_EQ(status.recovery_count(), 2);
  int leftover = 0;
  for (const Worker& w : workers_) {
    if (&w == first || &w == second) {
      EXPECT_TRUE(w.child->killed_by(SIGKILL)) << w.child->describe();
    } else if (absl::StrContains(w.child->out(), ", round 3, backend")) {
      EXPECT_EQ(w.child->exit_code(), 0) << w.child->describe();
    } else {
      ++leftover;
      EXPECT_EQ(w.child->exit_code(), 1) << w.child->describe();
      EXPECT_THAT(w.child->err(), HasSubstr("has ended (succeeded"))
          << w.child->describe();
    }
  }
  EXPECT_EQ(leftover, 1);
}

// A rank stopped with SIGSTOP (hung, its connections open): the
// coordinator finds it lost after 3 missed heartbeats and supersedes the
// round, the survivors abort their collective at once (not at --timeout,
// 60 s here) and re-form with the spare. Woken after that, the stale process
// never joins the new round: it is turned away.
TEST_P(RecoveryProcessTest, HungRankIsReplacedAndNeverRejoinsItsOldRound) {
  const std::string job = Job("hung");
  std::vector<std::string> flags = ModelFlags();
  flags.insert(flags.end(), {"--synthetic_size=96", "--steps=400",
                             "--batch_size=4", "--timeout=60s"});
  for (int i = 0; i < 4; ++i) StartWorker(job, i, "3", flags);
  Worker* rank0 = nullptr;
  Worker* stopped = nullptr;
  const int victim = RandomRank();
  ASSERT_TRUE(PumpUntil(Children(), kBound, [&] {
    rank0 = RankInRound(1, 0, 3);
    stopped = RankInRound(1, victim, 3);
    return rank0 != nullptr && stopped != nullptr &&
           absl::StrContains(rank0->child->out(), "step 20/");
  })) << Describe();
  stopped->child->Signal(SIGSTOP);
  const absl::Time stop_time = absl::Now();
  // Round 2 forms without it, well before the 60 s collective timeout.
  ASSERT_TRUE(PumpUntil(Children(), kBound, [&] {
    return RankInRound(2, 2, 3) != nullptr;
  })) << Describe();
  EXPECT_LT(absl::Now() - stop_time, absl::Seconds(30));
  stopped->child->Signal(SIGCONT);
  ASSERT_TRUE(WaitAll(Children(), kBound)) << Describe();
  v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 2);
  EXPECT_THAT(status.recoveries(0).cause(), HasSubstr("missed 3 heartbeats"));
  for (const Worker& w : workers_) {
    if (&w == stopped) {
      EXPECT_THAT(w.child->out(), Not(HasSubstr(", round 2,")))
          << w.child->describe();
      EXPECT_EQ(w.child->exit_code(), 1) << w.child->describe();
      EXPECT_THAT(w.child->err(), HasSubstr("has ended (succeeded"))
          << w.child->describe();
    } else {
      EXPECT_EQ(w.child->exit_code(), 0) << w.child->describe();
    }
  }
}

// A node that joins while the round runs below MAX: the members finish the
// step in flight, stop together after it and re-form the round with the
// node, world size 2 -> 3; no step is run twice and none is a recovery.
TEST_P(RecoveryProcessTest, GrowsWhenANodeJoinsBelowMax) {
  const std::string job = Job("grow");
  // Long enough that the third process, which starts once round 1 runs
  // (a LibTorch process start and a join: 3.5 s seen on a loaded machine),
  // joins mid-training and is admitted at a heartbeat (1 s) before the end:
  // 2,400 steps at world size 2 over Gloo (the test took 9-18 s here), 3
  // times as many over shared memory, whose steps are faster (the 2,400
  // took 4 s there, which a loaded machine's third process missed).
  const int kSamples =
      GetParam() == Transport::kSharedMemory ? 3 * 9600 : 9600;
  constexpr int kEpochs = 2;
  std::vector<std::string> flags = ModelFlags();
  flags.insert(flags.end(), {absl::StrCat("--synthetic_size=", kSamples),
                             absl::StrCat("--epochs=", kEpochs),
                             "--batch_size=4", "--shuffle",
                             "--last_call_timeout=0s"});
  for (int i = 0; i < 2; ++i) StartWorker(job, i, "2:3", flags);
  ASSERT_TRUE(PumpUntil(Children(), kBound, [&] {
    return RankInRound(1, 1, 2) != nullptr;
  })) << Describe();
  StartWorker(job, 2, "2:3", flags);
  ExpectSurvivorsSucceeded({}, 2);
  v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 2);
  EXPECT_EQ(status.world_size(), 3);
  ASSERT_EQ(status.recoveries_size(), 1);
  EXPECT_THAT(status.recoveries(0).cause(),
              HasSubstr("re-forms at a step boundary to admit it"));
  // No step of round 1 was abandoned: round 2 starts with the next one.
  const auto [last, next] = StepsAroundRoundEnd(workers_, 1);
  EXPECT_GT(last, 0);
  EXPECT_EQ(next, last + 1);
  EXPECT_EQ(status.recoveries(0).resume_step(), last);
  for (const Worker& w : workers_) {
    EXPECT_THAT(w.child->err(), Not(HasSubstr("recovery 1 of")))
        << w.child->describe();
  }
  // 3 ranks may pad the rest of the epoch they divide by up to 2 samples.
  ExpectEverySampleUsedOnce(workers_, kSamples, kEpochs, /*padding=*/2);
}

// An exact global batch (--global_batch_size=24 in micro-batches of 4)
// through a shrink and a grow: one of 3 ranks is killed with no spare
// (--nnodes=2:3), the job goes on at world size 2, then a new process
// joins and the round re-forms at a step boundary to 3. The final
// parameters equal those of an uninterrupted 3-rank run with the same
// global batch.
TEST_P(RecoveryProcessTest, AGlobalBatchStaysExactThroughAShrinkAndAGrow) {
  ExpectGlobalBatchExactThroughAShrinkAndAGrow();
}

void RecoveryProcessTest::ExpectGlobalBatchExactThroughAShrinkAndAGrow() {
  const std::string job = Job("global-batch");
  // Steps enough that the fourth process (a LibTorch start and a join: 2-3 s
  // here, more on a loaded machine) joins round 2 well before training
  // ends (round 2 alone would take 7-10 s here); shared memory's steps
  // are the faster.
  const int steps = GetParam() == Transport::kSharedMemory ? 3000 : 1500;
  ComparedRun run = StartReference(
      job, {"--synthetic_size=960", absl::StrCat("--steps=", steps),
            "--batch_size=4", "--global_batch_size=24", "--shuffle",
            "--max_recoveries=2", "--float64"});
  // Round 1 waits up to 5 s for its third node; round 2 closes with two
  // after as long.
  std::vector<std::string> flags = run.flags;
  flags.push_back("--last_call_timeout=5s");
  for (int i = 0; i < 3; ++i) StartWorker(job, i, "2:3", flags);
  Worker* killed = KillAtStep(1, RandomRank(), 3, RandomStep(10, 50));
  ASSERT_NE(killed, nullptr);
  ASSERT_TRUE(PumpUntil(Children(), kBound, [&] {
    return RankInRound(2, 1, 2) != nullptr;
  })) << Describe();
  StartWorker(job, 3, "2:3", flags);
  ExpectSurvivorsSucceeded({killed}, 3);
  v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 3);
  EXPECT_EQ(status.world_size(), 3);
  ExpectSameParametersAsTheReference(&run);
}

// The rank a worker got in round 1, from its first line ("rank R of 3");
// -1 when it has none.
int FirstRank(const std::string& out) {
  const size_t at = out.find("rank ");
  return at == std::string::npos ? -1 : out[at + 5] - '0';
}

// Rank `rank`'s share in a rebalance's verdict ("shares 11,3,10 of 24");
// -1 when it names none.
int ShareIn(const std::string& verdict, int rank) {
  std::smatch shares;
  if (rank < 0 || rank > 2 ||
      !std::regex_search(verdict, shares,
                         std::regex("shares (\\d+),(\\d+),(\\d+) of"))) {
    return -1;
  }
  return std::stoi(shares[1 + rank].str());
}

// The median step time in progress lines ("step 12/500 ... step 4.1 ms
// ...") of `text`, skipping the first `skip` (at most half of them); 0
// when there are none.
double MedianStepMs(const std::string& text, size_t skip) {
  std::vector<double> times;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "step ")) continue;
    const size_t at = line.find("  step ");
    if (at == absl::string_view::npos) continue;
    double ms = 0;
    absl::string_view rest = line.substr(at + 7);
    if (absl::SimpleAtod(rest.substr(0, rest.find(' ')), &ms)) times.push_back(ms);
  }
  // A loaded machine may rebalance within the first `skip` steps: then
  // half of them go.
  skip = std::min(skip, times.size() / 2);
  if (times.empty()) return 0;
  times.erase(times.begin(), times.begin() + skip);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Stragglers rebalanced: one of 3 ranks computes 4 times slower
// (--slowdown=4). With an exact global batch of 24 micro-batches (8 a
// rank) the coordinator flags it (--straggler_threshold=3ms), measures
// what a micro-batch takes each rank, and re-forms the round at a step
// boundary with micro-batches moved away from it (round 2, a planned
// re-form, no step lost); steps get faster, and the job ends with the
// parameters of an uninterrupted run without the slow rank.
TEST_P(RecoveryProcessTest, AStragglersMicroBatchesMoveToTheOthers) {
  ExpectAStragglerRebalanced();
}

void RecoveryProcessTest::ExpectAStragglerRebalanced() {
  const std::string job = Job("rebalance");
  // The reference's output is read only at the end: no progress lines,
  // which would fill its pipe.
  ComparedRun run = StartReference(
      job, {"--synthetic_size=3840", "--steps=500", "--batch_size=16",
            "--global_batch_size=384", "--max_recoveries=2", "--log_every=0",
            "--float64"});
  std::vector<std::string> flags = run.flags;
  flags.push_back("--straggler_threshold=3ms");
  flags.push_back("--log_every=1");  // rank 0's step times, before and after
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> mine = flags;
    if (i == 1) mine.push_back("--slowdown=4");
    StartWorker(job, i, "3", mine);
  }
  ExpectSurvivorsSucceeded({}, 2);
  const v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  // Measured speeds are noisy here: another rebalance may follow the
  // first (one asked for at the very end is not carried out).
  EXPECT_GE(status.round(), 2);
  EXPECT_TRUE(status.diagnosis().has_rebalance());
  ASSERT_GE(status.recoveries_size(), 1) << status.DebugString();
  const std::string& first = status.recoveries(0).cause();
  // The slow process's rank in round 1, from its first line.
  const int slow_rank = FirstRank(workers_[1].child->out());
  ASSERT_GE(slow_rank, 0);
  EXPECT_THAT(first, HasSubstr(absl::StrCat("rank ", slow_rank, " takes ")));
  const int slow_share = ShareIn(first, slow_rank);
  ASSERT_GE(slow_share, 0) << first;
  EXPECT_LT(slow_share, 8) << first;
  std::cout << "rebalanced: " << first << "\n";
  // Rank 0's steps, before and after.
  for (const Worker& w : workers_) {
    const std::string& text = w.child->out();
    if (!absl::StrContains(text, "rank 0 of 3 (node")) continue;
    const size_t split = text.find(", round 2,");
    ASSERT_NE(split, std::string::npos) << w.child->describe();
    const double before = MedianStepMs(text.substr(0, split), 20);
    const double after = MedianStepMs(text.substr(split), 5);
    std::cout << "median step " << before << " ms before, " << after
              << " ms after (" << after / before << "x)\n";
    EXPECT_LT(after, before);
  }
  ExpectSameParametersAsTheReference(&run);
}

// A straggler that recovers gets its micro-batches back: one rank is 4x
// slow in round 1 only (--slowdown_until_round=1). The coordinator moves
// micro-batches away from it (round 2); then the ranks carrying its work
// are the late ones, and it moves them back towards an even division
// (round 3). The job is stopped once round 3 forms.
TEST_P(RecoveryProcessTest, AStragglerThatRecoversGetsItsMicroBatchesBack) {
  const std::string job = Job("recovers");
  std::vector<std::string> flags = ModelFlags();
  for (const char* flag :
       {"--hidden=64", "--synthetic_size=3840", "--steps=100000",
        "--batch_size=16", "--global_batch_size=384", "--max_recoveries=2",
        "--straggler_threshold=3ms", "--log_every=0"}) {
    flags.push_back(flag);
  }
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> mine = flags;
    if (i == 1) {
      mine.push_back("--slowdown=4");
      mine.push_back("--slowdown_until_round=1");
    }
    StartWorker(job, i, "3", mine);
  }
  v1::JobStatus status;
  ASSERT_TRUE(PumpUntil(Children(), kBound, [&] {
    // Ask only once the job exists (round 1 trains).
    if (!absl::StrContains(workers_[0].child->out(), ", round 1,")) {
      return false;
    }
    status = JobStatus(job);
    return status.round() >= 3;
  })) << status.DebugString() << Describe();
  for (Worker& w : workers_) w.child->Signal(SIGKILL);
  ASSERT_TRUE(WaitAll(Children(), kBound));
  ASSERT_GE(status.recoveries_size(), 2) << status.DebugString();
  const std::string& away = status.recoveries(0).cause();
  const std::string& back = status.recoveries(1).cause();
  std::cout << "away: " << away << "\nback: " << back << "\n";
  const int slow_rank = FirstRank(workers_[1].child->out());
  ASSERT_GE(slow_rank, 0);
  // Away from the slow rank: its share in round 2.
  EXPECT_THAT(away, HasSubstr(absl::StrCat("rank ", slow_rank, " takes ")));
  const int slow_share = ShareIn(away, slow_rank);
  ASSERT_GE(slow_share, 0) << away;
  EXPECT_LT(slow_share, 8) << away;
  // Back: round 2's re-division gives it more. (Not asserted: how close to
  // even the shares come. The speeds are measured on a shared machine, where
  // a full test run beside this one made another rank look 5.6x slower for
  // a window and the shares went 18,3,3; the balancer follows what it
  // measures, which share_balancer_test pins.)
  const v1::Rebalance& latest = status.diagnosis().rebalance();
  ASSERT_EQ(latest.shares_size(), 3);
  EXPECT_EQ(latest.round(), 2);
  EXPECT_GT(latest.shares(slow_rank), slow_share) << latest.verdict();
}

// Silent data corruption: one bit of one parameter flips in a random
// process right after step 37 (failpoint corrupt_parameters). With
// fingerprints every 50 steps, the coordinator finds at step 50 that its
// replica
// differs from the other two, names the rank, the step and the tensor, and
// heals: the round re-forms with its state copied from a rank of the
// majority, and the last step's fingerprints agree on every rank
// (replicas_verified_step): the replicas end bit-identical. (Not equal to
// an uninterrupted run's: until the heal the corrupted replica's gradients
// went into everyone's all-reduce.)
TEST_P(RecoveryProcessTest, ACorruptedReplicaIsFoundAndHealed) {
  ExpectACorruptedReplicaIsHealed();
}

void RecoveryProcessTest::ExpectACorruptedReplicaIsHealed() {
  const std::string job = Job("corrupt");
  // Steps enough for the divergence at step 50 to reach the coordinator
  // (each rank's next heartbeat, 1 s) and the members to be told (their
  // next heartbeat) well before the job ends: 4,000 steps take 8 s here
  // (2,500 over Gloo, whose steps are slower).
  const int kSteps = GetParam() == Transport::kGloo ? 2500 : 4000;
  std::vector<std::string> config = ModelFlags();
  config.insert(config.end(),
                {"--synthetic_size=96", absl::StrCat("--steps=", kSteps),
                 "--batch_size=4", "--max_recoveries=2",
                 "--fingerprint_every=50"});
  const int victim = RandomRank(0, 2, "corrupting the replica of process");
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> flags = config;
    if (i == victim) flags.push_back("--failpoint=corrupt_parameters:37");
    StartWorker(job, i, "3", flags);
  }
  ExpectSurvivorsSucceeded({}, 2);
  const Worker& corrupted = workers_[victim];
  EXPECT_THAT(corrupted.child->err(),
              HasSubstr("failpoint corrupt_parameters hit at step 37"));
  int rank = -1;  // the corrupted process's rank in round 1
  for (int r = 0; r < 3; ++r) {
    if (RankInRound(1, r, 3) == &corrupted) rank = r;
  }
  v1::JobStatus status = JobStatus(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
  EXPECT_EQ(status.round(), 2);
  EXPECT_EQ(status.world_size(), 3);
  const v1::Divergence& divergence = status.diagnosis().divergence();
  EXPECT_EQ(divergence.step(), 50) << divergence.verdict();
  EXPECT_EQ(divergence.round(), 1);
  EXPECT_THAT(divergence.ranks(), ::testing::ElementsAre(rank));
  ASSERT_GT(divergence.tensors_size(), 0) << divergence.verdict();
  EXPECT_THAT(divergence.verdict(), HasSubstr("healing"));
  ASSERT_EQ(status.recoveries_size(), 1);
  EXPECT_THAT(status.recoveries(0).cause(),
              HasSubstr("replicas diverged at step 50"));
  EXPECT_EQ(status.diagnosis().replicas_verified_step(), kSteps);
}

std::string TransportName(const ::testing::TestParamInfo<Transport>& info) {
  switch (info.param) {
    case Transport::kSharedMemory:
      return "SharedMemory";
    case Transport::kGloo:
      return "Gloo";
    case Transport::kSimulatedGpu:
      break;
  }
  return "SimulatedGpu";
}

INSTANTIATE_TEST_SUITE_P(Trainer, RecoveryProcessTest,
                         ::testing::Values(Transport::kSharedMemory,
                                           Transport::kGloo),
                         TransportName);

// ---------------------------------------------------------------------------
// The GPU path on simulated devices: gradsync-worker --device=sim, the NCCL
// backend over the simulated NCCL.
class SimulatedGpuRecoveryTest : public RecoveryProcessTest {
 protected:
  // A 3-rank job whose rank `victim` gets `failpoint`, beside its
  // uninterrupted reference: it heals in place (the three processes
  // re-form the round) and ends with the reference's parameters and
  // buffers. The model: cnn_bn, whose BatchNorm statistics and counters a
  // dropped step's forward has moved before the step fails.
  void ExpectHealedWithTheUninterruptedResult(const std::string& job,
                                              const std::string& failpoint,
                                              int victim) {
    ComparedRun run = StartReference(
        job,
        {"--synthetic_size=96", "--steps=300", "--batch_size=4",
         "--max_recoveries=2"},
        {"--model=cnn_bn", "--hidden=8"});
    std::vector<std::string> flags = run.flags;
    flags.insert(flags.end(), {"--timeout=3s", "--log_every=0"});
    for (int i = 0; i < 3; ++i) {
      std::vector<std::string> mine = flags;
      if (i == victim) mine.push_back("--failpoint=" + failpoint);
      StartWorker(job, i, "3", mine);
    }
    ExpectSurvivorsSucceeded({}, 2);
    EXPECT_THAT(workers_[victim].child->err(),
                HasSubstr(absl::StrCat("failpoint ",
                                       failpoint.substr(0, failpoint.find(':')),
                                       " hit")))
        << workers_[victim].child->describe();
    v1::JobStatus status = JobStatus(job);
    EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.reason();
    EXPECT_EQ(status.round(), 2);
    EXPECT_EQ(status.world_size(), 3);
    EXPECT_EQ(status.backend(), v1::BACKEND_NCCL);
    ExpectSameParametersAsTheReference(&run);
  }
};

TEST_P(SimulatedGpuRecoveryTest, SpareReplacesAKilledRankWithoutChangingTheResult) {
  ExpectSpareReplacesAKilledRank();
}

TEST_P(SimulatedGpuRecoveryTest, AGlobalBatchStaysExactThroughAShrinkAndAGrow) {
  ExpectGlobalBatchExactThroughAShrinkAndAGrow();
}

// Micro-batches move between ranks of NCCL over the simulated device.
TEST_P(SimulatedGpuRecoveryTest, AStragglersMicroBatchesMoveToTheOthers) {
  ExpectAStragglerRebalanced();
}

// The fingerprints are taken where the tensors are (on the device).
TEST_P(SimulatedGpuRecoveryTest, ACorruptedReplicaIsFoundAndHealed) {
  ExpectACorruptedReplicaIsHealed();
}

// The 40th NCCL collective of one rank (a buffer broadcast or a gradient
// bucket's all-reduce, well into training) fails asynchronously after the
// host moved on: that rank and its peers drop the step instead of applying
// half-reduced gradients, put back the BatchNorm statistics its forward
// moved, re-form the round and end where an uninterrupted run ends.
TEST_P(SimulatedGpuRecoveryTest, AnAsyncNcclErrorIsHealedWithoutApplyingTheStep) {
  ExpectHealedWithTheUninterruptedResult(
      Job("async"), "nccl_async_error:40",
      RandomRank(0, 2, "the failpoint goes to rank"));
}

// The 40th NCCL collective of one rank never completes: the watchdogs
// (--timeout=3s) abort the communicators, and the job heals the same way.
TEST_P(SimulatedGpuRecoveryTest, AHungNcclCollectiveIsHealed) {
  ExpectHealedWithTheUninterruptedResult(
      Job("hang"), "nccl_hang:40", RandomRank(0, 2, "the failpoint goes to rank"));
}

// "round R: rank K on sim:D" lines of a worker's log: round -> device.
std::map<int64_t, std::string> DevicesByRound(const std::string& log) {
  std::map<int64_t, std::string> devices;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    const size_t at = line.find("round ");
    const size_t on = line.find(" on sim:");
    if (at == absl::string_view::npos || on == absl::string_view::npos) continue;
    int64_t round = 0;
    const absl::string_view number =
        line.substr(at + 6, line.find(':', at) - at - 6);
    if (!absl::SimpleAtoi(number, &round)) continue;
    devices[round] = std::string(line.substr(on + 4));
  }
  return devices;
}

// Four processes of one node on four simulated devices; one is killed and a
// new process replaces it: every survivor keeps its device, the newcomer
// gets the one the lost process left, and no two ranks of a round share one.
TEST_P(SimulatedGpuRecoveryTest, ProcessesKeepTheirDevicesThroughAReplacement) {
  const std::string job = Job("devices");
  std::vector<std::string> flags = ModelFlags();
  // --backend=nccl: forced, as a GPU job may force it (auto picks it too).
  flags.insert(flags.end(), {"--synthetic_size=96", "--steps=150",
                             "--batch_size=4", "--nproc_per_node=4",
                             "--backend=nccl"});
  workers_.reserve(5);
  for (int i = 0; i < 4; ++i) StartWorker(job, i, "1", flags, "node");
  Worker* killed = KillAtStep(1, RandomRank(1, 3), 4, RandomStep(10, 60));
  ASSERT_NE(killed, nullptr);
  StartWorker(job, 4, "1", flags, "node");
  ExpectSurvivorsSucceeded({killed}, 2);
  std::map<int64_t, std::set<std::string>> used;  // round -> devices
  for (const Worker& w : workers_) {
    const std::map<int64_t, std::string> mine = DevicesByRound(w.child->err());
    ASSERT_FALSE(mine.empty()) << w.child->describe();
    std::set<std::string> distinct;
    for (const auto& [round, device] : mine) {
      distinct.insert(device);
      EXPECT_TRUE(used[round].insert(device).second)
          << device << " twice in round " << round << "\n" << Describe();
    }
    EXPECT_EQ(distinct.size(), 1u) << "moved: " << w.child->describe();
  }
  EXPECT_EQ(used[1].size(), 4u) << Describe();
  EXPECT_EQ(used[2], used[1]) << Describe();
  EXPECT_EQ(JobStatus(job).backend(), v1::BACKEND_NCCL);
}

INSTANTIATE_TEST_SUITE_P(Trainer, SimulatedGpuRecoveryTest,
                         ::testing::Values(Transport::kSimulatedGpu),
                         TransportName);

}  // namespace
}  // namespace gradsync
