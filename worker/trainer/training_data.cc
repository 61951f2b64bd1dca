// Which samples each step of a TrainingRun trains on: the division of the
// epoch among the round's ranks, or the global batch's shares.
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/data/distributed_sampler.h"
#include "worker/data/global_batch.h"
#include "worker/trainer/training_run_impl.h"

namespace gradsync {

using trainer_internal::Division;
using trainer_internal::MicroBatch;
using trainer_internal::Position;

namespace {

// Appends "round step epoch rank i,j,..." to `path` (AppendLogLine).
void LogSamples(const std::string& path, int64_t round, int64_t step,
                int64_t epoch, int rank, const torch::Tensor& batch) {
  torch::Tensor host = batch.cpu();
  const int64_t* p = host.data_ptr<int64_t>();
  trainer_internal::AppendLogLine(
      path, absl::StrCat(round, " ", step, " ", epoch, " ", rank, " ",
                         absl::StrJoin(p, p + host.numel(), ","), "\n"));
}

}  // namespace

namespace trainer_internal {

void AppendLogLine(const std::string& path, const std::string& line) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot open the log ", path);
  const ssize_t written = ::write(fd, line.data(), line.size());
  ::close(fd);
  TORCH_CHECK(written == static_cast<ssize_t>(line.size()),
              "cannot write the log ", path);
}

}  // namespace trainer_internal

absl::StatusOr<int64_t> TrainingRun::Impl::StartRoundData(
    const TrainContext& context, DistributedDataParallel* ddp,
    Division* division) {
  if (plan_.has_value()) {
    const absl::Status start = plan_->CheckStepStart(position_.epoch_position);
    if (!start.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          start.message(), ": was the state written with another "
                           "--global_batch_size, or without one?"));
    }
    return config_.steps > 0 ? config_.steps
                             : config_.epochs * plan_->steps_per_epoch();
  }
  GS_RETURN_IF_ERROR(StartDivision(context, division));
  GS_RETURN_IF_ERROR(BeginUnevenEpoch(ddp));
  if (config_.steps > 0) return config_.steps;
  return position_.step +
         (MicroBatchesLeft(*division, context.world_size) +
          config_.accumulate - 1) / config_.accumulate;
}

// Divides the rest of the current epoch among the round's ranks; moves to
// the next epoch when nothing of it is left for them.
absl::Status TrainingRun::Impl::StartDivision(const TrainContext& context,
                                              Division* division) {
  for (;;) {
    GS_ASSIGN_OR_RETURN(
        DistributedSampler sampler,
        DistributedSampler::Create({data_.size(), context.rank,
                                    context.world_size, config_.shuffle,
                                    config_.seed, config_.drop_last,
                                    position_.epoch_position}));
    sampler.SetEpoch(position_.epoch);
    division->epoch = position_.epoch;
    division->start = position_.epoch_position;
    division->span = data_.size() - position_.epoch_position;
    const int64_t batches =
        (sampler.num_samples() + config_.batch_size - 1) / config_.batch_size;
    division->batches = batches;
    division->job_batches = batches;
    if (uneven()) {  // every rank's share has the same number of batches
      const auto& caps = config_.rank_batches;
      division->batches = std::min(batches, caps[context.rank]);
      division->job_batches =
          std::min(batches, *std::max_element(caps.begin(), caps.end()));
    }
    division->next = 0;
    division->global_batch = int64_t{config_.batch_size} * context.world_size;
    division->indices =
        torch::tensor(sampler.Indices(), torch::kInt64).to(device_);
    if (batches > 0) return absl::OkStatus();
    if (position_.epoch_position == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the dataset (", data_.size(), " samples) leaves rank ",
          context.rank, " nothing to train on"));
    }
    position_.epoch += 1;  // the rest of this epoch is too small to divide
    position_.epoch_position = 0;
  }
}

bool TrainingRun::Impl::Done() const {
  return config_.steps > 0 ? position_.step >= config_.steps
                           : position_.epoch >= config_.epochs;
}

// Micro-batches from `division`'s next batch to the end of training (epoch
// mode), were the world size to stay; under uneven inputs, the job's steps.
int64_t TrainingRun::Impl::MicroBatchesLeft(const Division& division,
                                            int world_size) const {
  absl::StatusOr<DistributedSampler> whole = DistributedSampler::Create(
      {data_.size(), 0, world_size, config_.shuffle, config_.seed,
       config_.drop_last});
  const int64_t per_rank = whole.ok() ? whole->num_samples() : 0;
  int64_t per_epoch = (per_rank + config_.batch_size - 1) / config_.batch_size;
  int64_t this_epoch = division.batches - division.next;
  if (uneven()) {  // the job's steps: its longest rank's
    const auto& caps = config_.rank_batches;
    per_epoch = std::min(per_epoch, *std::max_element(caps.begin(), caps.end()));
    this_epoch = std::max<int64_t>(division.job_batches - division.next, 0);
  }
  return this_epoch + (config_.epochs - division.epoch - 1) * per_epoch;
}

// This rank's next batch (advancing `cursor`, a copy of the position that
// becomes the committed one when the step commits); moves `division` to the
// next epoch at its end.
torch::Tensor TrainingRun::Impl::NextBatch(const TrainContext& context,
                                           Division* division, Position* cursor,
                                           int64_t step) {
  if (division->next == division->batches) {
    Position saved = position_;
    position_ = *cursor;
    absl::Status started = StartDivision(context, division);
    position_ = saved;
    TORCH_CHECK(started.ok(), started.ToString());
  }
  const int64_t j = division->next++;
  const int64_t rows = division->indices.size(0);
  torch::Tensor batch = division->indices.slice(
      0, j * config_.batch_size,
      std::min<int64_t>((j + 1) * config_.batch_size, rows));
  cursor->epoch = division->epoch;
  cursor->epoch_position =
      division->start +
      std::min(division->span, (j + 1) * division->global_batch);
  if (division->next == division->batches) {
    cursor->epoch += 1;  // the epoch is over
    cursor->epoch_position = 0;
  }
  if (!config_.sample_log.empty()) {
    LogSamples(config_.sample_log, context.round, step, division->epoch,
               context.rank, batch);
  }
  return batch;
}

std::vector<MicroBatch> TrainingRun::Impl::RankMicroBatches(
    const TrainContext& context, Division* division, int64_t step,
    Position* cursor, int64_t* global_samples) {
  const int64_t count =
      config_.steps > 0
          ? config_.accumulate
          : std::min<int64_t>(config_.accumulate,
                              MicroBatchesLeft(*division, context.world_size));
  std::vector<MicroBatch> micro;
  for (int64_t m = 0; m < count; ++m) {
    torch::Tensor batch = NextBatch(context, division, cursor, step);
    *global_samples += batch.size(0) * context.world_size;
    micro.push_back(MicroBatch{std::move(batch), division->epoch,
                               /*sum=*/false, static_cast<double>(count)});
  }
  return micro;
}

const torch::Tensor& TrainingRun::Impl::EpochOrder(int64_t epoch) {
  if (epoch_order_of_ != epoch) {
    absl::StatusOr<DistributedSampler> sampler = DistributedSampler::Create(
        {data_.size(), 0, 1, config_.shuffle, config_.seed, false, 0});
    TORCH_CHECK(sampler.ok(), sampler.status().ToString());
    sampler->SetEpoch(epoch);
    epoch_order_ = torch::tensor(sampler->Indices(), torch::kInt64).to(device_);
    epoch_order_of_ = epoch;
  }
  return epoch_order_;
}

std::vector<MicroBatch> TrainingRun::Impl::GlobalMicroBatches(
    const TrainContext& context, int64_t step, Position* cursor,
    int64_t* global_samples) {
  const torch::Tensor& order = EpochOrder(cursor->epoch);
  // The coordinator's shares, or the even ones. Shares that do not fit
  // (another global batch on some rank) fall back to the even division on
  // every rank alike: all ranks read the same assignment.
  absl::StatusOr<MicroBatchShare> given = plan_->Share(
      context.rank, context.world_size, context.micro_batch_shares);
  if (!given.ok() && bad_shares_round_ != context.round) {
    bad_shares_round_ = context.round;
    GS_LOG(WARNING) << "round " << context.round << ": " << given.status()
                    << "; dividing them evenly";
  }
  const MicroBatchShare share =
      given.ok() ? *given : plan_->EvenShare(context.rank, context.world_size);
  const double divisor = plan_->LossDivisor(context.world_size);
  std::vector<MicroBatch> micro;
  for (int64_t j = share.first; j < share.first + share.count; ++j) {
    const SampleSpan span = plan_->MicroBatchSpan(cursor->epoch_position, j);
    micro.push_back(MicroBatch{order.slice(0, span.begin, span.end),
                               cursor->epoch, /*sum=*/true, divisor});
    if (!config_.sample_log.empty()) {
      LogSamples(config_.sample_log, context.round, step, cursor->epoch,
                 context.rank, micro.back().indices);
    }
  }
  if (micro.empty()) {  // more ranks than micro-batches: zero gradients
    const SampleSpan span = plan_->MicroBatchSpan(cursor->epoch_position, 0);
    micro.push_back(MicroBatch{order.slice(0, span.begin, span.end),
                               cursor->epoch, /*sum=*/true, divisor,
                               /*counts=*/false});
  }
  *global_samples += plan_->global_batch();
  cursor->epoch_position += plan_->global_batch();
  if (plan_->EndsEpoch(cursor->epoch_position)) {
    cursor->epoch += 1;  // the tail shorter than a global batch is dropped
    cursor->epoch_position = 0;
  }
  return micro;
}

}  // namespace gradsync
