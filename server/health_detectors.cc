#include "server/health_detectors.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"

namespace gradsync {
namespace {

bool SameFingerprint(const v1::CollectiveFingerprint& a,
                     const v1::CollectiveFingerprint& b) {
  return a.op() == b.op() && a.dtype() == b.dtype() && a.count() == b.count() &&
         a.bucket_index() == b.bucket_index();
}

std::string DescribeFingerprint(const v1::CollectiveFingerprint& f) {
  std::string text = absl::StrCat(f.op(), " of ", f.count(), " ", f.dtype());
  if (f.bucket_index() >= 0) {
    absl::StrAppend(&text, " (bucket ", f.bucket_index(), ")");
  }
  return text;
}

absl::Duration Median(std::vector<absl::Duration> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

DesyncDetector::DesyncDetector() : slots_(kWindow) {}

std::optional<std::string> DesyncDetector::Observe(
    int rank, const v1::CollectiveFingerprint& f) {
  if (found_ || f.sequence() <= 0) return std::nullopt;
  Slot& slot = slots_[f.sequence() % kWindow];
  if (slot.sequence < f.sequence()) {
    slot.sequence = f.sequence();
    slot.rank = rank;
    slot.fingerprint = f;
    return std::nullopt;
  }
  if (slot.sequence > f.sequence() || slot.rank == rank ||
      SameFingerprint(slot.fingerprint, f)) {
    return std::nullopt;
  }
  found_ = true;
  return absl::StrCat(
      "collectives desynchronized at #", f.sequence(), ": rank ", slot.rank,
      " issued ", DescribeFingerprint(slot.fingerprint), " but rank ", rank,
      " issued ", DescribeFingerprint(f),
      "; every rank must issue the same collectives in the same order "
      "(look for rank-dependent control flow)");
}

StragglerDetector::StragglerDetector(int world_size, absl::Duration threshold)
    : world_size_(world_size),
      threshold_(threshold),
      steps_(kStepWindow),
      ranks_(world_size) {
  for (StepSlot& slot : steps_) {
    slot.ready.assign(world_size, absl::InfinitePast());
  }
  for (RankLags& r : ranks_) r.ring.assign(kLagSamples, absl::ZeroDuration());
}

std::optional<std::vector<v1::Straggler>> StragglerDetector::Observe(
    int rank, const v1::StepReady& ready) {
  if (ready.step() < 0 || rank < 0 || rank >= world_size_) return std::nullopt;
  StepSlot& slot = steps_[ready.step() % kStepWindow];
  if (slot.step > ready.step()) return std::nullopt;
  if (slot.step < ready.step()) {
    slot.step = ready.step();
    slot.reported = 0;
    std::fill(slot.ready.begin(), slot.ready.end(), absl::InfinitePast());
  }
  if (slot.ready[rank] != absl::InfinitePast()) return std::nullopt;
  slot.ready[rank] = FromProtoTime(ready.time());
  if (++slot.reported < world_size_) return std::nullopt;
  std::vector<v1::Straggler> stragglers = Complete(slot);
  slot.step = -1;
  return stragglers;
}

std::vector<v1::Straggler> StragglerDetector::Complete(const StepSlot& slot) {
  const absl::Time earliest =
      *std::min_element(slot.ready.begin(), slot.ready.end());
  std::vector<v1::Straggler> stragglers;
  for (int r = 0; r < world_size_; ++r) {
    RankLags& lags = ranks_[r];
    lags.ring[lags.count++ % kLagSamples] = slot.ready[r] - earliest;
    const int samples = std::min(lags.count, kLagSamples);
    lags.lag = Median(std::vector<absl::Duration>(lags.ring.begin(),
                                                  lags.ring.begin() + samples));
    if (samples >= kMinLagSamples && lags.lag > threshold_) {
      v1::Straggler& s = stragglers.emplace_back();
      s.set_rank(r);
      *s.mutable_lag() = ToProtoDuration(lags.lag);
      s.set_steps(samples);
    }
  }
  std::sort(stragglers.begin(), stragglers.end(),
            [](const v1::Straggler& a, const v1::Straggler& b) {
              return FromProtoDuration(a.lag()) > FromProtoDuration(b.lag());
            });
  return stragglers;
}

}  // namespace gradsync
