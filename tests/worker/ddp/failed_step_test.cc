// A failed step is neither applied nor counted, in process: DDP over the
// NCCL backend on simulated devices, ranks as threads, with an asynchronous
// error injected into one rank's gradient all-reduce (or its buffer
// broadcast) after its host moved on. The backward returns (its stream wait for the bucket said nothing
// about the error, as on a GPU), and DistributedDataParallel::CheckStep
// reports the failure on that rank for that step, so a loop that steps the
// optimizer only after CheckStep is OK (the trainer's commit rule,
// worker/trainer/trainer.cc) leaves the parameters as they were.
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/nccl_sim_group.h"
#include "tests/worker/ddp/tensor_lists.h"
#include "worker/backend/nccl_backend.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/nccl_faults.h"
#include "worker/backend/store.h"
#include "worker/ddp/distributed_data_parallel.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Copy;
using ::gradsync::testing::Equal;
using ::gradsync::testing::kBound;
using ::testing::HasSubstr;

// A simulated device on which the host is sure to have moved on before an
// injected error exists. After HoldNextHostFunction(), the next host
// function queued through this device (the injected asynchronous error's,
// nccl_faults.cc) waits, on its stream, until the host has queued a wait on
// the null stream (Work::SynchronizeStream: the reducer's wait for the
// bucket), at most kBound. So that wait finds the collective pending and
// returns OK once the stream has passed it, error or not, as a GPU's
// cudaStreamWaitEvent does. Everything else is the wrapped device's.
// Thread-safe. Lifetime: as the wrapped device.
class HostFirstDevice final : public NcclDevice {
 public:
  explicit HostFirstDevice(std::unique_ptr<NcclDevice> inner)
      : inner_(std::move(inner)) {}

  void HoldNextHostFunction() {
    absl::MutexLock lock(&mu_);
    hold_next_ = true;
  }

  absl::Status LaunchHostFunction(void* stream,
                                  std::function<void()> fn) override {
    std::shared_ptr<absl::Notification> gate;
    {
      absl::MutexLock lock(&mu_);
      if (hold_next_) {
        hold_next_ = false;
        gate = held_ = std::make_shared<absl::Notification>();
      }
    }
    if (gate == nullptr) {
      return inner_->LaunchHostFunction(stream, std::move(fn));
    }
    return inner_->LaunchHostFunction(stream, [gate, fn = std::move(fn)] {
      gate->WaitForNotificationWithTimeout(kBound);
      fn();
    });
  }
  absl::Status StreamWaitEvent(void* stream, void* event) override {
    if (stream == nullptr) {
      absl::MutexLock lock(&mu_);
      if (held_ != nullptr) held_->Notify();
      held_ = nullptr;
    }
    return inner_->StreamWaitEvent(stream, event);
  }

  std::string name() const override { return inner_->name(); }
  int index() const override { return inner_->index(); }
  DeviceKind buffer_kind() const override { return inner_->buffer_kind(); }
  absl::Status MakeCurrent() override { return inner_->MakeCurrent(); }
  absl::StatusOr<void*> CreateStream() override {
    return inner_->CreateStream();
  }
  void DestroyStream(void* stream) override { inner_->DestroyStream(stream); }
  absl::StatusOr<void*> CreateEvent(bool timing) override {
    return inner_->CreateEvent(timing);
  }
  void DestroyEvent(void* event) override { inner_->DestroyEvent(event); }
  absl::Status RecordEvent(void* event, void* stream) override {
    return inner_->RecordEvent(event, stream);
  }
  absl::StatusOr<bool> EventDone(void* event) override {
    return inner_->EventDone(event);
  }
  absl::Status SynchronizeEvent(void* event) override {
    return inner_->SynchronizeEvent(event);
  }
  absl::StatusOr<absl::Duration> ElapsedTime(void* start, void* end) override {
    return inner_->ElapsedTime(start, end);
  }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  void Free(void* data) override { inner_->Free(data); }
  int64_t MemoryInUse() override { return inner_->MemoryInUse(); }
  absl::StatusOr<std::string> NewUniqueId() override {
    return inner_->NewUniqueId();
  }
  absl::StatusOr<std::unique_ptr<NcclComm>> StartComm(
      const std::string& unique_id, int world_size, int rank) override {
    return inner_->StartComm(unique_id, world_size, rank);
  }

 private:
  const std::unique_ptr<NcclDevice> inner_;
  absl::Mutex mu_;
  bool hold_next_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<absl::Notification> held_ ABSL_GUARDED_BY(mu_);
};

// A fault plan whose next collective after Arm() ends with an asynchronous
// error; which collective that was (1, 2, ... of the communicator).
class AsyncErrorOnNext {
 public:
  void Arm() { armed_ = true; }
  uint64_t fired_at() const { return fired_at_; }
  CommFaultPlan Plan() {
    return [this](uint64_t collective) {
      CommFault fault;
      if (armed_.exchange(false)) {
        fault.kind = CommFault::Kind::kAsyncError;
        fired_at_ = collective;
      }
      return fault;
    };
  }

 private:
  std::atomic<bool> armed_{false};
  std::atomic<uint64_t> fired_at_{0};
};

constexpr int kWorld = 2;
constexpr int kFailingRank = 1;

// Two ranks' NCCL backends on simulated devices, rank kFailingRank's behind
// a HostFirstDevice with an AsyncErrorOnNext plan. Members in destruction
// order: the backends go before the devices and the plan they use.
struct FaultyPair {
  FaultyPair() {
    std::vector<std::unique_ptr<NcclDevice>> made = testing::SimDevices(kWorld);
    if (made[kFailingRank] == nullptr) return;
    host_first = new HostFirstDevice(std::move(made[kFailingRank]));
    made[kFailingRank].reset(host_first);
    devices = std::move(made);
    group = testing::StartNcclGroup(devices, &store, testing::kHealthyTimeout,
                                    [&](int rank) {
                                      return rank == kFailingRank
                                                 ? fault.Plan()
                                                 : nullptr;
                                    });
  }
  bool ok() const { return group.size() == static_cast<size_t>(kWorld); }

  std::vector<std::unique_ptr<NcclDevice>> devices;
  HostFirstDevice* host_first = nullptr;  // devices[kFailingRank]
  AsyncErrorOnNext fault;
  InMemoryStore store;
  std::vector<std::unique_ptr<NcclBackend>> group;
};

torch::nn::Sequential Model() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Linear(6, 5), nn::ReLU(), nn::Linear(5, 2));
}

torch::Tensor Input(int rank, int step) {
  return torch::arange(24, torch::kFloat32).reshape({4, 6}) * 0.05 *
         (rank + step);
}

// What one rank saw of its steps.
struct RankLog {
  int committed = 0;               // steps applied (the optimizer stepped)
  int failed_step = 0;             // the step that failed, 0 if none
  bool backward_returned = false;  // in the failed step
  absl::Status check;              // CheckStep's status in the failed step
  std::vector<torch::Tensor> before_failed;    // parameters before it
  std::vector<torch::Tensor> after;            // parameters at the end
  std::vector<torch::Tensor> unreduced_grads;  // left by the failed step
};

// Rank 1's first gradient all-reduce of step 3 fails asynchronously after
// its host moved on: both ranks drop step 3 (rank 0's all-reduce fails with
// it, its peer having aborted), and their parameters stay those of step 2.
TEST(DdpFailedStepTest,
     AnAsyncErrorAfterTheHostMovedOnIsNeitherAppliedNorCounted) {
  constexpr int kFailingStep = 3;
  FaultyPair world;
  ASSERT_TRUE(world.ok());
  HostFirstDevice* host_first = world.host_first;
  AsyncErrorOnNext& fault = world.fault;
  auto& group = world.group;
  std::vector<torch::nn::Sequential> models;
  torch::manual_seed(11);  // on this thread: the generator is process-wide
  for (int rank = 0; rank < kWorld; ++rank) models.push_back(Model());

  std::vector<RankLog> logs(kWorld);
  testing::OnEveryRank(kWorld, [&](int rank) {
    RankLog& log = logs[rank];
    auto ddp = DistributedDataParallel::Create(models[rank], group[rank].get());
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    torch::optim::SGD optimizer(models[rank]->parameters(),
                                torch::optim::SGDOptions(0.1));
    for (int step = 1; step <= kFailingStep; ++step) {
      const std::vector<torch::Tensor> before =
          Copy(models[rank]->parameters());
      optimizer.zero_grad();
      torch::Tensor loss = (*ddp)->forward(Input(rank, step)).pow(2).mean();
      if (rank == kFailingRank && step == kFailingStep) {
        host_first->HoldNextHostFunction();
        fault.Arm();
      }
      absl::Status check;
      bool backward_returned = true;
      try {
        loss.backward();
        check = (*ddp)->CheckStep();
      } catch (const c10::Error& e) {
        backward_returned = false;
        check = absl::UnknownError(e.what_without_backtrace());
      }
      if (check.ok()) {  // the rule: a step is applied only once it checked
        optimizer.step();
        ++log.committed;
        continue;
      }
      log.failed_step = step;
      log.backward_returned = backward_returned;
      log.check = check;
      log.before_failed = before;
      for (const torch::Tensor& p : models[rank]->parameters()) {
        log.unreduced_grads.push_back(p.grad().clone());
      }
      break;
    }
    log.after = Copy(models[rank]->parameters());
  });
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  const RankLog& failing = logs[kFailingRank];
  ASSERT_NE(fault.fired_at(), 0u) << "the error was never injected";
  EXPECT_EQ(failing.failed_step, kFailingStep) << failing.check;
  EXPECT_TRUE(failing.backward_returned)
      << "the host did not move on: the backward already saw " << failing.check;
  EXPECT_EQ(failing.check.code(), absl::StatusCode::kUnavailable)
      << failing.check;
  EXPECT_THAT(failing.check.message(),
              HasSubstr("a gradient collective of this step"));
  EXPECT_THAT(
      failing.check.message(),
      HasSubstr(absl::StrCat("injected asynchronous error in collective #",
                             fault.fired_at())));
  // The step would have changed the parameters had it been applied.
  double unreduced = 0;
  for (const torch::Tensor& g : failing.unreduced_grads) {
    unreduced += g.abs().sum().item<double>();
  }
  EXPECT_GT(unreduced, 0.0);
  for (int rank = 0; rank < kWorld; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_EQ(logs[rank].failed_step, kFailingStep) << logs[rank].check;
    EXPECT_EQ(logs[rank].committed, kFailingStep - 1);
    EXPECT_TRUE(Equal(logs[rank].after, logs[rank].before_failed))
        << "the failed step changed the parameters";
  }
  EXPECT_TRUE(Equal(logs[0].after, logs[1].after))
      << "the ranks left the failed step with different parameters";
}

// A linear layer whose output is scaled and shifted by two buffers: what a
// buffer broadcast carries, in one float32 bucket of two tensors, and what
// the forward reads but does not change.
struct ScaledLinearImpl : torch::nn::Module {
  ScaledLinearImpl()
      : linear(register_module("linear", torch::nn::Linear(6, 2))),
        scale(register_buffer("scale", torch::ones({2}))),
        shift(register_buffer("shift", torch::zeros({2}))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return linear(x) * scale + shift;
  }
  torch::nn::Linear linear;
  torch::Tensor scale;
  torch::Tensor shift;
};

// Rank 1's buffer broadcast before the forward of step 2 fails
// asynchronously after its host moved on (as on a GPU, where the forward's
// kernels are only queued after it): the forward returns, and the failure is
// learned, naming the broadcast, from CheckStep or (when no CheckStep came:
// an evaluation pass) from the next forward, before it issues anything.
// Rank 1 keeps its own buffer values (it received into a copy of them, so
// the copy back cannot bring uninitialized memory).
class FailedBufferBroadcastTest : public ::testing::TestWithParam<bool> {
 protected:
  bool learned_from_next_forward() const { return GetParam(); }
};

TEST_P(FailedBufferBroadcastTest, IsReportedAndLeavesTheRanksOwnBuffers) {
  FaultyPair world;
  ASSERT_TRUE(world.ok());
  std::vector<std::shared_ptr<ScaledLinearImpl>> models;
  for (int rank = 0; rank < kWorld; ++rank) {
    models.push_back(std::make_shared<ScaledLinearImpl>());
  }

  bool forward_returned = false;
  std::string learned;  // the failure as the call that reported it said it
  absl::Status recorded;
  std::vector<torch::Tensor> own;
  std::vector<torch::Tensor> after;
  testing::OnEveryRank(kWorld, [&](int rank) {
    auto ddp = DistributedDataParallel::Create(models[rank], world.group[rank].get());
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    // Step 1: a healthy step.
    (*ddp)->forward(Input(rank, 1)).pow(2).mean().backward();
    ASSERT_TRUE((*ddp)->CheckStep().ok());
    if (rank != kFailingRank) {
      try {  // its broadcast may fail too, its peer having aborted
        (*ddp)->forward(Input(rank, 2));
      } catch (const c10::Error&) {
      }
      (*ddp)->CheckStep().IgnoreError();
      return;
    }
    {
      torch::NoGradGuard no_grad;
      models[rank]->scale.fill_(7.0);
      models[rank]->shift.copy_(torch::tensor({-3.0, 0.25}));
    }
    own = Copy(models[rank]->buffers());
    world.host_first->HoldNextHostFunction();
    world.fault.Arm();
    try {
      (*ddp)->forward(Input(rank, 2));
      forward_returned = true;
    } catch (const c10::Error& e) {
      learned = e.what_without_backtrace();
      return;
    }
    if (learned_from_next_forward()) {
      try {
        (*ddp)->forward(Input(rank, 3));
      } catch (const c10::Error& e) {
        learned = e.what_without_backtrace();
      }
    } else {
      const absl::Status check = (*ddp)->CheckStep();
      learned = check.ToString();
      EXPECT_EQ(check, (*ddp)->communication_error());
    }
    recorded = (*ddp)->communication_error();
    after = Copy(models[rank]->buffers());
  });
  ASSERT_FALSE(::testing::Test::HasFatalFailure());

  ASSERT_NE(world.fault.fired_at(), 0u) << "the error was never injected";
  ASSERT_TRUE(forward_returned)
      << "the host did not move on: the forward already saw " << learned;
  const std::string injected = absl::StrCat(
      "injected asynchronous error in collective #", world.fault.fired_at());
  EXPECT_THAT(learned, HasSubstr("the buffer broadcast before the forward (#"));
  EXPECT_THAT(learned, HasSubstr(injected));
  EXPECT_EQ(recorded.code(), absl::StatusCode::kUnavailable) << recorded;
  EXPECT_THAT(recorded.message(), HasSubstr(injected));
  EXPECT_TRUE(Equal(after, own))
      << "the failed broadcast left other values than rank 1's own";
}

INSTANTIATE_TEST_SUITE_P(
    LearnedBy, FailedBufferBroadcastTest, ::testing::Bool(),
    [](const ::testing::TestParamInfo<bool>& info) {
      return info.param ? std::string("NextForward") : std::string("CheckStep");
    });

}  // namespace
}  // namespace gradsync
