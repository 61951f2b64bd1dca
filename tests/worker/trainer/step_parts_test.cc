// Where a step's time goes, as the trainer reports it (TrainSummary), with
// a slow peer: the NCCL backend on simulated devices, ranks as threads,
// rank 1's collectives starting late. The wait for the slow all-reduce is
// counted once: on host memory (the simulated device) the backward's end
// waits for the buckets' data, so it is the exposed communication, and the
// commit wait (after the micro-batches, for the collectives to be known
// good) and the update stay short. On a GPU, by the code (the reducer
// only queues a stream wait for each bucket), the host would wait in the
// commit wait instead: not yet measured there. The parts of a step do not
// add up to more than the step, but for the backend's completion thread:
// the exposed communication ends when that thread saw the collective end,
// which may be a scheduling delay after the trainer's thread went on. A
// wall clock stepped back mid-step makes no reported time negative.
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/nccl_sim_group.h"
#include "worker/backend/nccl_backend.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/nccl_faults.h"
#include "worker/backend/store.h"
#include "worker/runtime/step_report.h"
#include "worker/trainer/trainer.h"

namespace gradsync {
namespace {

constexpr int kWorld = 2;
// Every collective of rank 1 starts this late on its stream (a slow peer),
// so every rank's step waits about this long for its all-reduce.
constexpr absl::Duration kDelay = absl::Milliseconds(100);
// How much later than the trainer's thread the backend's completion thread
// may see a collective end on a loaded machine. Counting the slow peer's
// wait twice would add a whole kDelay.
constexpr absl::Duration kCompletionThreadLag = absl::Milliseconds(25);

CommFaultPlan DelayEverything() {
  return [](uint64_t) {
    CommFault fault;
    fault.kind = CommFault::Kind::kDelay;
    fault.delay = kDelay;
    return fault;
  };
}

TrainerConfig Config() {
  TrainerConfig config;
  config.model.kind = "mlp";
  config.model.hidden = 16;
  config.synthetic_size = 64;
  config.batch_size = 4;
  config.steps = 6;
  config.warmup_steps = 1;
  config.log_every = 0;
  config.fingerprint_every = 0;
  return config;
}

// One run of Config() per rank, made on this thread: their seeding draws
// from LibTorch's process-wide generator. Fewer when one failed (reported).
std::vector<std::unique_ptr<TrainingRun>> Runs(int world) {
  std::vector<std::unique_ptr<TrainingRun>> runs;
  for (int rank = 0; rank < world; ++rank) {
    absl::StatusOr<std::unique_ptr<TrainingRun>> run =
        TrainingRun::Create(Config());
    if (!run.ok()) {
      ADD_FAILURE() << run.status();
      break;
    }
    runs.push_back(*std::move(run));
  }
  return runs;
}

// Rank `rank` of `world` in round 1 over `backend`, printing nothing.
TrainContext RoundOne(Backend* backend, int rank, int world) {
  TrainContext context;
  context.backend = backend;
  context.rank = rank;
  context.world_size = world;
  context.round = 1;
  context.progress = nullptr;
  return context;
}

TEST(StepPartsTest, ASlowPeersWaitIsCountedOnceAndThePartsFitTheStep) {
  std::vector<std::unique_ptr<NcclDevice>> devices =
      testing::SimDevices(kWorld);
  InMemoryStore store;
  auto group = testing::StartNcclGroup(
      devices, &store, testing::kHealthyTimeout,
      [](int rank) { return rank == 1 ? DelayEverything() : nullptr; });
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  std::vector<std::unique_ptr<TrainingRun>> runs = Runs(kWorld);
  ASSERT_EQ(runs.size(), static_cast<size_t>(kWorld));
  std::vector<absl::StatusOr<TrainSummary>> summaries(kWorld);
  testing::OnEveryRank(kWorld, [&](int rank) {
    TrainContext context = RoundOne(group[rank].get(), rank, kWorld);
    summaries[rank] = runs[rank]->TrainRound(context);
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    SCOPED_TRACE(rank);
    ASSERT_TRUE(summaries[rank].ok()) << summaries[rank].status();
    const TrainSummary& s = *summaries[rank];
    EXPECT_GE(s.mean_exposed_communication, kDelay / 2);
    EXPECT_LT(s.mean_commit_wait, kDelay / 2);
    EXPECT_LT(s.mean_backward, kDelay / 2);
    EXPECT_GT(s.mean_update, absl::ZeroDuration());
    EXPECT_LE(s.mean_forward + s.mean_backward +
                  s.mean_exposed_communication + s.mean_commit_wait +
                  s.mean_update,
              s.mean_step_time + kCompletionThreadLag);
  }
}

// A wall clock stepped back by a second at every reading (NTP stepping a
// clock that ran ahead, over and over). Thread-safe.
class SteppedBackClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    now_ -= absl::Seconds(1);
    return now_;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_) =
      absl::FromUnixSeconds(1767225600);
};

// Every time a step reports is measured backwards on such a clock: each
// counts as 0, and the runtime (CheckStepReport) takes every report, where
// a negative time would fail the step after it committed.
TEST(StepPartsTest, AClockSteppedBackMakesNoStepTimeNegative) {
  for (bool one_rank : {true, false}) {
    SCOPED_TRACE(one_rank ? "one rank" : "two ranks, simulated NCCL");
    const int world = one_rank ? 1 : kWorld;
    std::vector<std::unique_ptr<NcclDevice>> devices =
        testing::SimDevices(world);
    InMemoryStore store;
    auto group = testing::StartNcclGroup(
        devices, &store, testing::kHealthyTimeout, [](int) { return nullptr; });
    ASSERT_EQ(group.size(), static_cast<size_t>(world));
    std::vector<std::unique_ptr<TrainingRun>> runs = Runs(world);
    ASSERT_EQ(runs.size(), static_cast<size_t>(world));
    SteppedBackClock clock;
    std::vector<absl::StatusOr<TrainSummary>> summaries(world);
    std::vector<int> reports(world);
    std::vector<absl::Duration> starts(world * 2, -absl::Seconds(1));
    testing::OnEveryRank(world, [&](int rank) {
      TrainContext context = RoundOne(group[rank].get(), rank, world);
      context.clock = &clock;
      context.on_step = [&, rank](const StepReport& report, int64_t samples) {
        ++reports[rank];
        return CheckStepReport(report, samples);
      };
      context.on_round_started = [&, rank](absl::Duration transfer,
                                           absl::Duration first_step) {
        starts[2 * rank] = transfer;
        starts[2 * rank + 1] = first_step;
      };
      summaries[rank] = runs[rank]->TrainRound(context);
    });
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_TRUE(summaries[rank].ok()) << summaries[rank].status();
      EXPECT_EQ(reports[rank], Config().steps);
      EXPECT_EQ(summaries[rank]->mean_step_time, absl::ZeroDuration());
      EXPECT_EQ(starts[2 * rank], absl::ZeroDuration());
      EXPECT_EQ(starts[2 * rank + 1], absl::ZeroDuration());
    }
  }
}

}  // namespace
}  // namespace gradsync
