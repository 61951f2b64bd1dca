#include "worker/trainer/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/data/datasets.h"
#include "worker/data/distributed_sampler.h"
#include "worker/ddp/distributed_data_parallel.h"
#include "worker/ddp/tensor_buffer.h"
#include "worker/trainer/params_io.h"

namespace gradsync {
namespace {

absl::Status ValidateConfig(const TrainerConfig& config) {
  if (config.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch_size must be at least 1, got ", config.batch_size));
  }
  if (config.steps < 0 || (config.steps == 0 && config.epochs < 1)) {
    return absl::InvalidArgumentError(
        "give a positive --steps, or --epochs of at least 1");
  }
  if (config.accumulate < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--accumulate must be at least 1, got ", config.accumulate));
  }
  if (config.lr <= 0 || config.momentum < 0) {
    return absl::InvalidArgumentError(
        "--lr must be positive and --momentum not negative");
  }
  if (config.device != "cpu" && config.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got '", config.device, "'"));
  }
  if (config.device == "cuda" && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "--device=cuda, but this LibTorch has no CUDA or sees no GPU");
  }
  return absl::OkStatus();
}

absl::StatusOr<ImageDataset> LoadDataset(const TrainerConfig& config) {
  if (config.dataset == "synthetic") {
    if (config.synthetic_size < 1) {
      return absl::InvalidArgumentError("--synthetic_size must be positive");
    }
    return MakeSyntheticDataset(config.synthetic_size, config.seed);
  }
  if (config.dataset == "mnist") {
    if (config.data_dir.empty()) {
      return absl::InvalidArgumentError("--dataset=mnist needs --data_dir");
    }
    return LoadMnist(config.data_dir);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--dataset must be synthetic or mnist, got '", config.dataset, "'"));
}

// The mean of `value` over all ranks (one small all-reduce).
absl::StatusOr<double> MeanOverRanks(Backend* backend, double value,
                                     const torch::Device& device,
                                     absl::Duration timeout) {
  if (backend == nullptr) return value;
  torch::Tensor t = torch::full({1}, value,
                                torch::TensorOptions(torch::kFloat64).device(device));
  GS_ASSIGN_OR_RETURN(Buffer buffer, ToBuffer(t));
  std::shared_ptr<Work> work = backend->AllReduce(buffer, ReduceOp::kAverage);
  GS_RETURN_IF_ERROR(work->Wait(timeout));
  return t.item<double>();
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Aggregates the steps after warm-up into the summary.
class StepStats {
 public:
  void Add(const StepReport& report) {
    step_times_.push_back(report.step_time);
    forward_ += report.ddp.forward;
    backward_ += report.ddp.backward_compute;
    communication_ += report.ddp.communication;
    hidden_ += report.ddp.hidden_communication;
  }
  void Fill(int64_t samples_per_step, TrainSummary* summary) const {
    if (step_times_.empty()) return;
    const int64_t n = static_cast<int64_t>(step_times_.size());
    absl::Duration total;
    for (absl::Duration d : step_times_) total += d;
    std::vector<absl::Duration> sorted = step_times_;
    std::sort(sorted.begin(), sorted.end());
    summary->mean_step_time = total / n;
    summary->median_step_time = sorted[n / 2];
    summary->samples_per_second =
        samples_per_step * n / std::max(absl::ToDoubleSeconds(total), 1e-9);
    summary->mean_forward = forward_ / n;
    summary->mean_backward = backward_ / n;
    summary->mean_communication = communication_ / n;
    summary->mean_hidden_communication = hidden_ / n;
  }

 private:
  std::vector<absl::Duration> step_times_;
  absl::Duration forward_, backward_, communication_, hidden_;
};

absl::StatusOr<TrainSummary> TrainOrThrow(const TrainerConfig& config,
                                          const TrainContext& context) {
  GS_RETURN_IF_ERROR(ValidateConfig(config));
  const torch::Device device =
      config.device == "cuda" ? torch::Device(torch::kCUDA, config.cuda_device)
                              : torch::Device(torch::kCPU);
  torch::manual_seed(config.seed);
  GS_ASSIGN_OR_RETURN(torch::nn::Sequential model, MakeModel(config.model));
  if (!config.load_params.empty()) {
    GS_RETURN_IF_ERROR(LoadParameters(*model, config.load_params));
  }
  model->to(device);
  GS_ASSIGN_OR_RETURN(ImageDataset data, LoadDataset(config));
  data.images = data.images.to(device);
  data.labels = data.labels.to(device);

  std::unique_ptr<DistributedDataParallel> ddp;
  if (context.backend != nullptr) {
    DdpOptions options;
    options.reducer = config.reducer;
    options.broadcast_buffers = config.broadcast_buffers;
    GS_ASSIGN_OR_RETURN(ddp, DistributedDataParallel::Create(
                                 model.ptr(), context.backend, options,
                                 context.clock));
  }
  torch::optim::SGD optimizer(
      model->parameters(),
      torch::optim::SGDOptions(config.lr).momentum(config.momentum));

  GS_ASSIGN_OR_RETURN(
      DistributedSampler sampler,
      DistributedSampler::Create({data.size(), context.rank,
                                  context.world_size, config.shuffle,
                                  config.seed, config.drop_last}));
  const int64_t per_epoch =
      (sampler.num_samples() + config.batch_size - 1) / config.batch_size;
  if (per_epoch == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the dataset (", data.size(), " samples) leaves rank ",
                     context.rank, " nothing to train on"));
  }
  const int64_t total_micro = config.steps > 0
                                  ? config.steps * config.accumulate
                                  : config.epochs * per_epoch;
  const int64_t total_steps =
      (total_micro + config.accumulate - 1) / config.accumulate;
  const bool printing = context.progress != nullptr && context.rank == 0;

  TrainSummary summary;
  for (const auto& p : model->parameters()) summary.parameters += p.numel();
  StepStats stats;
  torch::Tensor epoch_indices;
  int64_t micro = 0;
  absl::Time window_start = context.clock->Now();
  int64_t window_samples = 0;
  for (int64_t step = 1; step <= total_steps; ++step) {
    const absl::Time step_start = context.clock->Now();
    const int64_t micro_in_step =
        std::min<int64_t>(config.accumulate, total_micro - micro);
    StepReport report;
    report.step = step;
    int64_t step_samples = 0;
    // Zero in place: with gradient_as_bucket_view the gradients are the
    // buckets, so they must stay where they are.
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    for (int64_t m = 0; m < micro_in_step; ++m, ++micro) {
      const int64_t epoch = micro / per_epoch;
      const int64_t j = micro % per_epoch;
      if (j == 0 || !epoch_indices.defined()) {
        sampler.SetEpoch(epoch);
        epoch_indices = torch::tensor(sampler.Indices(), torch::kInt64).to(device);
      }
      report.epoch = epoch;
      torch::Tensor batch = epoch_indices.slice(
          0, j * config.batch_size,
          std::min<int64_t>((j + 1) * config.batch_size, sampler.num_samples()));
      step_samples += batch.size(0);
      window_samples += batch.size(0) * context.world_size;
      torch::Tensor x = data.images.index_select(0, batch);
      torch::Tensor y = data.labels.index_select(0, batch);
      auto forward = [&] {
        return torch::nn::functional::cross_entropy(model->forward(x), y) /
               static_cast<double>(micro_in_step);
      };
      torch::Tensor loss;
      if (ddp == nullptr) {
        loss = forward();
      } else if (m + 1 < micro_in_step) {
        auto no_sync = ddp->NoSync();
        loss = ddp->Forward(forward);
      } else {
        loss = ddp->Forward(forward);
      }
      loss.backward();
      report.loss += loss.item<double>();
    }
    optimizer.step();
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    report.step_time = context.clock->Now() - step_start;
    if (ddp != nullptr) report.ddp = ddp->last_step_timings();
    if (step > config.warmup_steps) stats.Add(report);
    if (context.on_step) {
      GS_RETURN_IF_ERROR(context.on_step(report, step_samples));
    }

    const bool last = step == total_steps;
    if (last || (config.log_every > 0 && step % config.log_every == 0)) {
      GS_ASSIGN_OR_RETURN(double mean_loss,
                          MeanOverRanks(context.backend, report.loss, device,
                                        config.reducer.timeout));
      summary.final_loss = mean_loss;
      const absl::Time now = context.clock->Now();
      const double rate = window_samples /
                          std::max(absl::ToDoubleSeconds(now - window_start), 1e-9);
      window_start = now;
      window_samples = 0;
      if (printing && config.log_every > 0) {
        std::string line = absl::StrFormat(
            "step %lld/%lld  epoch %lld  loss %.4f  %.0f samples/s  step %.1f ms",
            static_cast<long long>(step), static_cast<long long>(total_steps),
            static_cast<long long>(report.epoch), mean_loss, rate,
            Ms(report.step_time));
        if (ddp != nullptr) {
          const StepTimings& t = report.ddp;
          const double hidden =
              t.communication > absl::ZeroDuration()
                  ? 100.0 * (t.hidden_communication / t.communication)
                  : 100.0;
          absl::StrAppendFormat(
              &line, " (forward %.1f, backward %.1f, comm %.1f, %.0f%% hidden)",
              Ms(t.forward), Ms(t.backward_compute), Ms(t.communication),
              hidden);
        }
        std::fprintf(context.progress, "%s\n", line.c_str());
        std::fflush(context.progress);
      }
    }
  }
  summary.steps = total_steps;
  stats.Fill(int64_t{config.batch_size} * config.accumulate * context.world_size,
             &summary);
  if (!config.save_params.empty() && context.rank == 0) {
    GS_RETURN_IF_ERROR(SaveParameters(*model, config.save_params));
  }
  return summary;
}

}  // namespace

absl::StatusOr<TrainSummary> Train(const TrainerConfig& config,
                                   const TrainContext& context) {
  try {
    return TrainOrThrow(config, context);
  } catch (const c10::Error& e) {
    // The reducer fails backward() this way when a collective fails.
    return absl::AbortedError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

absl::StatusOr<int64_t> CountParameters(const ModelConfig& config) {
  GS_ASSIGN_OR_RETURN(torch::nn::Sequential model, MakeModel(config));
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  return count;
}

}  // namespace gradsync
