#include "worker/trainer/trainer_setup.h"

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<CommHook>> MakeCommHook(
    const TrainerConfig& config) {
  if (config.comm_hook == "allreduce") return std::make_shared<AllReduceHook>();
  if (config.comm_hook == "fp16_compress") {
    return std::make_shared<CompressHook>(torch::kHalf);
  }
  if (config.comm_hook == "bf16_compress") {
    return std::make_shared<CompressHook>(torch::kBFloat16);
  }
  if (config.comm_hook == "powersgd") {
    GS_ASSIGN_OR_RETURN(std::shared_ptr<PowerSgdHook> hook,
                        PowerSgdHook::Create(config.powersgd));
    return std::shared_ptr<CommHook>(std::move(hook));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "comm_hook must be allreduce, fp16_compress, bf16_compress or "
      "powersgd, got '", config.comm_hook, "'"));
}

namespace {

absl::Status ValidateGlobalBatch(const TrainerConfig& config) {
  if (!(config.slowdown >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slowdown must be at least 1 (1: none), got ", config.slowdown));
  }
  if (config.global_batch_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global_batch_size must not be negative, got ",
        config.global_batch_size));
  }
  if (config.global_batch_size == 0) return absl::OkStatus();
  if (config.global_batch_size % config.batch_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global_batch_size (", config.global_batch_size,
        ") must be a multiple of batch_size (", config.batch_size,
        "), the micro-batch it is cut into"));
  }
  if (config.accumulate != 1) {
    return absl::InvalidArgumentError(
        "global_batch_size sets how many micro-batches each rank "
        "accumulates; leave accumulate at 1");
  }
  if (!config.rank_batches.empty()) {
    return absl::InvalidArgumentError(
        "global_batch_size and rank_batches (uneven inputs) exclude each "
        "other");
  }
  if (config.sync_batchnorm) {
    return absl::InvalidArgumentError(
        "global_batch_size and sync_batchnorm exclude each other: ranks run "
        "different numbers of micro-batches, and SyncBatchNorm's forward is "
        "a collective");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const TrainerConfig& config) {
  if (config.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be at least 1, got ", config.batch_size));
  }
  if (config.steps < 0 || (config.steps == 0 && config.epochs < 1)) {
    return absl::InvalidArgumentError(
        "steps must be positive, or epochs at least 1");
  }
  if (config.accumulate < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "accumulate must be at least 1, got ", config.accumulate));
  }
  if (config.lr <= 0 || config.momentum < 0) {
    return absl::InvalidArgumentError(
        "lr must be positive and momentum not negative");
  }
  GS_RETURN_IF_ERROR(CheckDeviceType(config.device));
  if (config.device == v1::DEVICE_TYPE_CUDA && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "the device is cuda, but this LibTorch has no CUDA or sees no GPU");
  }
  if (!config.rank_batches.empty()) {
    if (config.accumulate != 1 || config.steps != 0) {
      return absl::InvalidArgumentError(
          "rank_batches needs accumulate 1 and epochs (not steps)");
    }
    for (int64_t n : config.rank_batches) {
      if (n < 0) {
        return absl::InvalidArgumentError("rank_batches must not be negative");
      }
    }
  }
  GS_RETURN_IF_ERROR(ValidateGlobalBatch(config));
  if (config.step_sleep < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_sleep must not be negative, got ",
                     absl::FormatDuration(config.step_sleep)));
  }
  if (config.fingerprint_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fingerprint_every must not be negative, got ",
        config.fingerprint_every));
  }
  if (config.checkpoint_every < 0 || config.checkpoint_keep < 1) {
    return absl::InvalidArgumentError(
        "checkpoint_every must not be negative and checkpoint_keep must be at "
        "least 1");
  }
  if ((config.checkpoint_every > 0 || config.resume) &&
      config.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "checkpoint_every and resume need a checkpoint_dir");
  }
  return MakeCommHook(config).status();
}

namespace {

absl::StatusOr<ImageDataset> ReadDataset(const TrainerConfig& config) {
  if (config.dataset == "synthetic") {
    if (config.synthetic_size < 1) {
      return absl::InvalidArgumentError("synthetic_size must be positive");
    }
    return MakeSyntheticDataset(config.synthetic_size, config.seed,
                                ModelInputShape(config.model));
  }
  if (config.dataset == "mnist" || config.dataset == "cifar10") {
    if (config.data_dir.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset ", config.dataset, " needs a data_dir"));
    }
    return config.dataset == "mnist" ? LoadMnist(config.data_dir)
                                     : LoadCifar10(config.data_dir);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dataset must be synthetic, mnist or cifar10, got '", config.dataset,
      "'"));
}

}  // namespace

absl::StatusOr<ImageDataset> LoadDataset(const TrainerConfig& config) {
  GS_ASSIGN_OR_RETURN(ImageDataset data, ReadDataset(config));
  const std::vector<int64_t> wanted = ModelInputShape(config.model);
  const auto shape = data.images.sizes().slice(1);
  if (std::vector<int64_t>(shape.begin(), shape.end()) != wanted) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset ", config.dataset, " has images of shape ",
        c10::str(shape), " but model ", config.model.kind, " takes ",
        c10::str(c10::IntArrayRef(wanted))));
  }
  return data;
}

}  // namespace gradsync
