// A LibTorch training loop of your own on gradsync: a small CNN with batch
// norm, converted to SyncBatchNorm, trained with DistributedDataParallel as
// a member of a gradsync job, checkpointed by rank 0 and resumable. Build it
// against the installed package (examples/CMakeLists.txt:
// find_package(gradsync)) or in this repository (//examples:train_ddp).
//
//   train_ddp --coordinator=HOST:29400 --job=example --nproc_per_node=2 \
//       --steps=100 --checkpoint_dir=/tmp/example
//
// Every process of the job runs it (or `gradsync launch ... train_ddp`).
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "gradsync/ddp.h"
#include "gradsync/job.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:29400", "the coordinator");
ABSL_FLAG(std::string, job, "example", "the job's id");
ABSL_FLAG(int, nproc_per_node, 1, "processes of the job on this node");
ABSL_FLAG(int64_t, steps, 50, "optimizer steps");
ABSL_FLAG(int, batch_size, 16, "samples per rank per step");
ABSL_FLAG(std::string, checkpoint_dir, "", "where rank 0 checkpoints");
ABSL_FLAG(int64_t, checkpoint_every, 10, "steps between checkpoints");
ABSL_FLAG(std::string, save_params, "", "rank 0 writes the final state here");

namespace {

constexpr int64_t kSamples = 1024;

// Noisy images of 4 classes, each a blend of its class's random pattern and
// noise.
struct Data {
  torch::Tensor images, labels;
};

Data MakeData() {
  torch::Generator generator = at::detail::createCPUGenerator(42);
  torch::Tensor patterns = torch::randn({4, 3, 12, 12}, generator);
  torch::Tensor labels = torch::randint(0, 4, {kSamples}, generator, torch::kInt64);
  torch::Tensor images = 0.5 * patterns.index_select(0, labels) +
                         torch::randn({kSamples, 3, 12, 12}, generator);
  return {images, labels};
}

torch::nn::Sequential MakeModel() {
  namespace nn = torch::nn;
  torch::manual_seed(1);
  return nn::Sequential({{"conv", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1))},
                         {"bn", nn::BatchNorm2d(8)},
                         {"relu", nn::ReLU()},
                         {"pool", nn::MaxPool2d(2)},
                         {"flatten", nn::Flatten()},
                         {"fc", nn::Linear(8 * 6 * 6, 4)}});
}

class ExampleTrainer : public gradsync::Trainer {
 public:
  ExampleTrainer() : model_(MakeModel()), data_(MakeData()) {}

  // Converts the model's batch norm, makes the optimizer and picks up the
  // newest checkpoint in `dir`, if any.
  absl::Status Init(const std::string& dir) {
    // Statistics of the global batch, not of each rank's shard.
    absl::Status converted = gradsync::ConvertSyncBatchNorm(model_.ptr()).status();
    if (!converted.ok()) return converted;
    optimizer_ = std::make_unique<torch::optim::SGD>(
        model_->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
    if (dir.empty()) return absl::OkStatus();
    absl::StatusOr<gradsync::CheckpointDir> folder = gradsync::CheckpointDir::Open(dir, 3);
    if (!folder.ok()) return folder.status();
    checkpoints_ = *std::move(folder);
    absl::StatusOr<std::optional<gradsync::Checkpoint>> latest = checkpoints_->LoadLatest();
    if (!latest.ok() || !latest->has_value()) return latest.status();
    step_ = (*latest)->step;
    std::printf("resuming from the checkpoint of step %lld\n", static_cast<long long>(step_));
    return gradsync::RestoreCheckpoint(**latest, *model_, *optimizer_);
  }

  absl::Status Train(const gradsync::Round& round) override {
    gradsync::DdpOptions options;
    options.broadcast_initial_state = false;  // the source rank's, below
    auto ddp = gradsync::DistributedDataParallel::Create(model_, round.backend, options);
    if (!ddp.ok()) return ddp.status();
    // Every rank takes the state of the rank furthest ahead (all equal at
    // the start; after a recovery, a survivor's).
    std::vector<int64_t> counters = {step_};
    absl::Status copied = gradsync::BroadcastTrainingState(
        round.backend, round.source_rank, *model_, *optimizer_, &counters,
        absl::Minutes(5));
    if (!copied.ok()) return copied;
    step_ = counters[0];
    const int batch = absl::GetFlag(FLAGS_batch_size);
    while (step_ < absl::GetFlag(FLAGS_steps)) {
      // PyTorch's DistributedSampler: this rank's share of the epoch.
      const int64_t per_epoch = kSamples / (batch * round.world_size);
      auto sampler = gradsync::DistributedSampler::Create(
          {kSamples, round.rank, round.world_size, /*shuffle=*/true});
      if (!sampler.ok()) return sampler.status();
      sampler->SetEpoch(step_ / per_epoch);
      const std::vector<int64_t> mine = sampler->Indices();
      torch::Tensor index = torch::tensor(mine, torch::kInt64)
                                .narrow(0, (step_ % per_epoch) * batch, batch);
      optimizer_->zero_grad();
      torch::Tensor output = (*ddp)->forward(data_.images.index_select(0, index));
      torch::Tensor loss =
          torch::nn::functional::cross_entropy(output, data_.labels.index_select(0, index));
      try {
        loss.backward();  // a lost peer fails it: report the collective's error
      } catch (const c10::Error& e) {
        absl::Status lost = (*ddp)->communication_error();
        return lost.ok() ? absl::InternalError(e.what_without_backtrace()) : lost;
      }
      // On a GPU the backward only ordered the streams after the
      // all-reduces: apply the step only once each is known to be good.
      absl::Status reduced = (*ddp)->CheckStep();
      if (!reduced.ok()) return reduced;
      optimizer_->step();
      ++step_;
      gradsync::StepReport report;
      report.step = step_;
      report.loss = loss.item<double>();
      report.ddp = (*ddp)->last_step_timings();
      absl::Status reported = round.report_step(report, batch);
      if (!reported.ok()) return reported;
      if (round.rank == 0 && step_ % 10 == 0) {
        std::printf("step %lld loss %.4f\n", static_cast<long long>(step_), report.loss);
        std::fflush(stdout);
      }
      absl::Status saved = MaybeCheckpoint(round.rank);
      if (!saved.ok()) return saved;
    }
    if (round.rank == 0 && !absl::GetFlag(FLAGS_save_params).empty()) {
      return gradsync::SaveParameters(*model_, absl::GetFlag(FLAGS_save_params));
    }
    return absl::OkStatus();
  }

  int64_t committed_step() const override { return step_; }

 private:
  absl::Status MaybeCheckpoint(int rank) {
    const int64_t every = absl::GetFlag(FLAGS_checkpoint_every);
    const bool last = step_ == absl::GetFlag(FLAGS_steps);
    if (rank != 0 || !checkpoints_.has_value() || (step_ % every != 0 && !last)) {
      return absl::OkStatus();
    }
    auto checkpoint = gradsync::CaptureCheckpoint(*model_, *optimizer_, step_, {});
    if (!checkpoint.ok()) return checkpoint.status();
    return checkpoints_->Save(*checkpoint);
  }

  torch::nn::Sequential model_;
  Data data_;
  std::unique_ptr<torch::optim::SGD> optimizer_;
  std::optional<gradsync::CheckpointDir> checkpoints_;
  int64_t step_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  gradsync::ConfigureMutexChecks();  // gradsync/job.h
  absl::ParseCommandLine(argc, argv);
  torch::set_num_threads(1);
  ExampleTrainer trainer;
  absl::Status status = trainer.Init(absl::GetFlag(FLAGS_checkpoint_dir));
  if (status.ok()) {
    gradsync::JobOptions options;
    options.coordinator = absl::GetFlag(FLAGS_coordinator);
    options.job = absl::GetFlag(FLAGS_job);
    options.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
    status = gradsync::RunJob(options, &trainer);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "train_ddp: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("train_ddp: done after %lld steps\n",
              static_cast<long long>(trainer.committed_step()));
  return 0;
}
