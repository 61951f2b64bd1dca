#include "worker/data/torch_sampler.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace gradsync {

struct TorchDistributedSampler::State {
  State(SamplerOptions options, DistributedSampler sampler)
      : options(options), sampler(std::move(sampler)) {}

  // Makes `epoch`'s index list the running one, from its start.
  void Deal(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    sampler.SetEpoch(epoch);
    const std::vector<int64_t> dealt = sampler.Indices();
    indices.assign(dealt.begin(), dealt.end());
    running_epoch = epoch;
    position = 0;
  }

  absl::Mutex mu;
  // What the index lists follow (reset(new_size) changes dataset_size).
  SamplerOptions options ABSL_GUARDED_BY(mu);
  // Over `options`; its epoch is set_epoch's, dealt at the next reset().
  DistributedSampler sampler ABSL_GUARDED_BY(mu);
  // The running epoch, this rank's index list for it, and how many of its
  // indices next() handed out (position <= indices.size()).
  int64_t running_epoch ABSL_GUARDED_BY(mu) = 0;
  std::vector<size_t> indices ABSL_GUARDED_BY(mu);
  size_t position ABSL_GUARDED_BY(mu) = 0;
  // Set by load(): the next reset() keeps the loaded position if the
  // running epoch is still the one set_epoch chose.
  bool keep_position ABSL_GUARDED_BY(mu) = false;
};

namespace {

// Archive keys: the running epoch and position, and the options that define
// the epoch's index list (checked on load).
constexpr char kEpoch[] = "epoch";
constexpr char kIndex[] = "index";
constexpr char kDatasetSize[] = "dataset_size";
constexpr char kRank[] = "rank";
constexpr char kWorldSize[] = "world_size";
constexpr char kShuffle[] = "shuffle";
constexpr char kSeed[] = "seed";
constexpr char kDropLast[] = "drop_last";
constexpr char kStart[] = "start";

std::string Describe(const SamplerOptions& o) {
  return absl::StrCat("rank ", o.rank, " of ", o.world_size, " over ",
                      o.dataset_size, " samples (shuffle ", o.shuffle,
                      ", seed ", o.seed, ", drop_last ", o.drop_last,
                      ", start ", o.start, ")");
}

bool SameDivision(const SamplerOptions& a, const SamplerOptions& b) {
  return a.dataset_size == b.dataset_size && a.rank == b.rank &&
         a.world_size == b.world_size && a.shuffle == b.shuffle &&
         a.seed == b.seed && a.drop_last == b.drop_last && a.start == b.start;
}

// The IValue under `key`; c10::Error naming the key when it is missing.
c10::IValue ReadKey(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value),
              "TorchDistributedSampler::load: the archive has no '", key,
              "': load an archive that TorchDistributedSampler::save wrote");
  return value;
}

int64_t ReadInt(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue value = ReadKey(archive, key);
  TORCH_CHECK(value.isInt(), "TorchDistributedSampler::load: '", key,
              "' is not an integer: load an archive that "
              "TorchDistributedSampler::save wrote");
  return value.toInt();
}

bool ReadBool(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue value = ReadKey(archive, key);
  TORCH_CHECK(value.isBool(), "TorchDistributedSampler::load: '", key,
              "' is not a bool: load an archive that "
              "TorchDistributedSampler::save wrote");
  return value.toBool();
}

}  // namespace

absl::StatusOr<TorchDistributedSampler> TorchDistributedSampler::Create(
    SamplerOptions options) {
  GS_ASSIGN_OR_RETURN(DistributedSampler sampler,
                      DistributedSampler::Create(options));
  auto state = std::make_shared<State>(options, std::move(sampler));
  absl::MutexLock lock(&state->mu);
  state->Deal(0);
  return TorchDistributedSampler(std::move(state));
}

TorchDistributedSampler::TorchDistributedSampler(std::shared_ptr<State> state)
    : state_(std::move(state)) {}

void TorchDistributedSampler::set_epoch(int64_t epoch) {
  absl::MutexLock lock(&state_->mu);
  state_->sampler.SetEpoch(epoch);
}

int64_t TorchDistributedSampler::epoch() const {
  absl::MutexLock lock(&state_->mu);
  return state_->sampler.epoch();
}

void TorchDistributedSampler::reset(torch::optional<size_t> new_size) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (new_size.has_value()) {
    SamplerOptions options = s.options;
    options.dataset_size = static_cast<int64_t>(*new_size);
    absl::StatusOr<DistributedSampler> sampler =
        DistributedSampler::Create(options);
    TORCH_CHECK(sampler.ok(), "TorchDistributedSampler::reset(", *new_size,
                "): ", std::string(sampler.status().message()),
                ": the new dataset size must fit the sampler's options");
    sampler->SetEpoch(s.sampler.epoch());
    s.options = options;
    s.sampler = *std::move(sampler);
    s.keep_position = false;  // the loaded position meant other samples
  }
  const bool keep = s.keep_position && s.sampler.epoch() == s.running_epoch;
  s.keep_position = false;
  if (!keep) s.Deal(s.sampler.epoch());
}

torch::optional<std::vector<size_t>> TorchDistributedSampler::next(
    size_t batch_size) {
  TORCH_CHECK(batch_size > 0,
              "TorchDistributedSampler::next: batch_size is 0; ask for at "
              "least one index");
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (s.position >= s.indices.size()) return torch::nullopt;
  const size_t count = std::min(batch_size, s.indices.size() - s.position);
  const auto first = s.indices.begin() + static_cast<ptrdiff_t>(s.position);
  std::vector<size_t> batch(first, first + static_cast<ptrdiff_t>(count));
  s.position += count;
  return batch;
}

void TorchDistributedSampler::save(
    torch::serialize::OutputArchive& archive) const {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  archive.write(kEpoch, c10::IValue(s.running_epoch));
  archive.write(kIndex, c10::IValue(static_cast<int64_t>(s.position)));
  archive.write(kDatasetSize, c10::IValue(s.options.dataset_size));
  archive.write(kRank, c10::IValue(static_cast<int64_t>(s.options.rank)));
  archive.write(kWorldSize,
                c10::IValue(static_cast<int64_t>(s.options.world_size)));
  archive.write(kShuffle, c10::IValue(s.options.shuffle));
  // IValue has no unsigned integer: the seed's bits as an int64.
  archive.write(kSeed, c10::IValue(static_cast<int64_t>(s.options.seed)));
  archive.write(kDropLast, c10::IValue(s.options.drop_last));
  archive.write(kStart, c10::IValue(s.options.start));
}

void TorchDistributedSampler::load(torch::serialize::InputArchive& archive) {
  const int64_t epoch = ReadInt(archive, kEpoch);
  const int64_t index = ReadInt(archive, kIndex);
  SamplerOptions saved;
  saved.dataset_size = ReadInt(archive, kDatasetSize);
  saved.rank = static_cast<int>(ReadInt(archive, kRank));
  saved.world_size = static_cast<int>(ReadInt(archive, kWorldSize));
  saved.shuffle = ReadBool(archive, kShuffle);
  saved.seed = static_cast<uint64_t>(ReadInt(archive, kSeed));
  saved.drop_last = ReadBool(archive, kDropLast);
  saved.start = ReadInt(archive, kStart);

  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  TORCH_CHECK(SameDivision(saved, s.options),
              "TorchDistributedSampler::load: the state was saved by ",
              Describe(saved), ", this sampler is ", Describe(s.options),
              ": its position would name other samples; load it into a "
              "sampler with the same options (after a world-size change, "
              "divide the rest of the epoch with SamplerOptions::start)");
  TORCH_CHECK(index >= 0 && index <= s.sampler.num_samples(),
              "TorchDistributedSampler::load: position ", index,
              " is outside this rank's epoch of ", s.sampler.num_samples(),
              " samples: the archive is damaged");
  s.Deal(epoch);
  s.position = static_cast<size_t>(index);
  s.keep_position = true;
}

size_t TorchDistributedSampler::index() const {
  absl::MutexLock lock(&state_->mu);
  return state_->position;
}

size_t TorchDistributedSampler::num_samples() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<size_t>(state_->sampler.num_samples());
}

}  // namespace gradsync
