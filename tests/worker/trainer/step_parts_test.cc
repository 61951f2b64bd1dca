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
// which may be a scheduling delay after the trainer's thread went on.
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/nccl_sim_group.h"
#include "worker/backend/nccl_backend.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/nccl_faults.h"
#include "worker/backend/store.h"
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

TEST(StepPartsTest, ASlowPeersWaitIsCountedOnceAndThePartsFitTheStep) {
  std::vector<std::unique_ptr<NcclDevice>> devices =
      testing::SimDevices(kWorld);
  InMemoryStore store;
  auto group = testing::StartNcclGroup(
      devices, &store, testing::kHealthyTimeout,
      [](int rank) { return rank == 1 ? DelayEverything() : nullptr; });
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  // Made on this thread: their seeding draws from LibTorch's process-wide
  // generator.
  std::vector<std::unique_ptr<TrainingRun>> runs;
  for (int rank = 0; rank < kWorld; ++rank) {
    absl::StatusOr<std::unique_ptr<TrainingRun>> run =
        TrainingRun::Create(Config());
    ASSERT_TRUE(run.ok()) << run.status();
    runs.push_back(*std::move(run));
  }
  std::vector<absl::StatusOr<TrainSummary>> summaries(kWorld);
  testing::OnEveryRank(kWorld, [&](int rank) {
    TrainContext context;
    context.backend = group[rank].get();
    context.rank = rank;
    context.world_size = kWorld;
    context.round = 1;
    context.progress = nullptr;
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

}  // namespace
}  // namespace gradsync
