#include "server/health_detectors.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

DivergenceDetector::DivergenceDetector(int world_size)
    : world_size_(world_size) {}

std::optional<DivergenceDetector::Outcome> DivergenceDetector::Observe(
    int rank, const v1::ReplicaFingerprint& f) {
  if (rank < 0 || rank >= world_size_ || f.step() <= 0) return std::nullopt;
  if (names_.empty() && f.tensor_names_size() > 0) {
    names_.assign(f.tensor_names().begin(), f.tensor_names().end());
  }
  auto it = steps_.find(f.step());
  if (it == steps_.end()) {
    if (static_cast<int>(steps_.size()) == kStepWindow) {
      if (f.step() < steps_.begin()->first) return std::nullopt;  // too old
      steps_.erase(steps_.begin());
    }
    it = steps_.emplace(f.step(), StepSlot()).first;
    it->second.tensors.assign(world_size_, std::nullopt);
  }
  StepSlot& slot = it->second;
  if (slot.tensors[rank].has_value()) return std::nullopt;  // a repeat
  slot.tensors[rank].emplace(f.tensors().begin(), f.tensors().end());
  if (++slot.reported < world_size_) return std::nullopt;
  Outcome outcome = Compare(it->first, slot);
  steps_.erase(it);
  return outcome;
}

std::string DivergenceDetector::TensorName(int index) const {
  return index < static_cast<int>(names_.size()) ? names_[index]
                                                 : absl::StrCat("tensor #", index);
}

DivergenceDetector::Outcome DivergenceDetector::Compare(
    int64_t step, const StepSlot& slot) const {
  Outcome outcome;
  outcome.step = step;
  // Ranks grouped by identical fingerprints; the largest group first seen.
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_size_; ++r) {
    auto same = std::find_if(groups.begin(), groups.end(), [&](const auto& g) {
      return *slot.tensors[g[0]] == *slot.tensors[r];
    });
    if (same == groups.end()) {
      groups.push_back({r});
    } else {
      same->push_back(r);
    }
  }
  if (groups.size() == 1) return outcome;
  const auto largest = std::max_element(
      groups.begin(), groups.end(),
      [](const auto& a, const auto& b) { return a.size() < b.size(); });
  outcome.majority = 2 * largest->size() > static_cast<size_t>(world_size_);
  const std::vector<uint64_t>& reference = *slot.tensors[(*largest)[0]];
  v1::Divergence& d = outcome.divergence.emplace();
  d.set_step(step);
  std::vector<bool> differs(reference.size(), false);
  for (int r = 0; r < world_size_; ++r) {
    const std::vector<uint64_t>& mine = *slot.tensors[r];
    if (outcome.majority && mine == reference) continue;
    d.add_ranks(r);
    for (size_t i = 0; i < reference.size(); ++i) {
      if (i >= mine.size() || mine[i] != reference[i]) differs[i] = true;
    }
  }
  for (size_t i = 0; i < differs.size(); ++i) {
    if (!differs[i]) continue;
    if (d.tensors_size() == kMaxNamedTensors) break;
    d.add_tensors(TensorName(static_cast<int>(i)));
  }
  const std::string where =
      d.tensors_size() > 0
          ? absl::StrCat(" in ", absl::StrJoin(d.tensors(), ", "))
          : " in the number of tensors";
  if (outcome.majority) {
    d.set_verdict(absl::StrCat(
        "replicas diverged at step ", step, ": rank(s) ",
        absl::StrJoin(d.ranks(), ","), " differ from rank(s) ",
        absl::StrJoin(*largest, ","), " (the majority)", where));
  } else {
    std::vector<std::string> parts;
    for (const auto& g : groups) parts.push_back(absl::StrJoin(g, ","));
    d.set_verdict(absl::StrCat(
        "replicas diverged at step ", step,
        " with no majority: rank groups ", absl::StrJoin(parts, " | "),
        " differ", where, "; nothing says which replica is right"));
  }
  return outcome;
}

}  // namespace gradsync
