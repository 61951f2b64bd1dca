// Desync, straggler and divergence detection as values: each takes what one member's
// heartbeat reported and returns a verdict; neither knows of the health
// manager, its locks, its clock or the wire beyond the reported messages.
// Not thread-safe: the owner serializes calls (HealthManager holds the
// round's lock). One detector per round.
#ifndef GRADSYNC_SERVER_HEALTH_DETECTORS_H_
#define GRADSYNC_SERVER_HEALTH_DETECTORS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

// Finds the first collective two ranks issued differently: every rank
// reports the fingerprints (op, dtype, count, bucket) of its recent
// collectives by sequence number; the detector keeps the first fingerprint
// of each of the latest kWindow sequence numbers and compares the others'
// with it.
class DesyncDetector {
 public:
  static constexpr int kWindow = 1024;

  DesyncDetector();

  // The verdict, the first time `rank`'s fingerprint differs from another
  // rank's for the same sequence number ("collectives desynchronized at
  // #N: rank A issued ... but rank B issued ..."); nullopt otherwise, and
  // always after a verdict.
  std::optional<std::string> Observe(int rank,
                                     const v1::CollectiveFingerprint& f);

 private:
  // The first fingerprint reported for one sequence number.
  struct Slot {
    int64_t sequence = 0;  // 0: empty
    int rank = 0;
    v1::CollectiveFingerprint fingerprint;
  };
  std::vector<Slot> slots_;
  bool found_ = false;
};

// Flags stragglers. Every rank reports, per step, when its first gradient
// bucket was ready; once every rank of the round reported a step, each
// rank's lag behind the earliest enters the ring of its last kLagSamples
// lags, whose median is its lag. A rank with at least kMinLagSamples lags
// whose lag is over the threshold is a straggler. Steps are matched within
// the latest kStepWindow.
class StragglerDetector {
 public:
  static constexpr int kStepWindow = 16;
  static constexpr int kLagSamples = 8;
  static constexpr int kMinLagSamples = 5;

  StragglerDetector(int world_size, absl::Duration threshold);

  // Takes `rank`'s report of one step. When it completes the step (every
  // rank reported it): the stragglers after it, slowest first (empty when
  // none); nullopt otherwise.
  std::optional<std::vector<v1::Straggler>> Observe(int rank,
                                                    const v1::StepReady& ready);

  // `rank`'s lag: the median of its recorded lags (zero before any).
  absl::Duration lag(int rank) const { return ranks_[rank].lag; }

 private:
  // The first-bucket-ready times of one step, by rank.
  struct StepSlot {
    int64_t step = -1;  // -1: empty
    int reported = 0;
    std::vector<absl::Time> ready;  // InfinitePast: not reported
  };
  struct RankLags {
    std::vector<absl::Duration> ring;  // the last kLagSamples
    int count = 0;                     // samples ever recorded
    absl::Duration lag;                // median of `ring`
  };
  // Records the lags of the complete `slot` and returns the stragglers.
  std::vector<v1::Straggler> Complete(const StepSlot& slot);

  const int world_size_;
  const absl::Duration threshold_;
  std::vector<StepSlot> steps_;
  std::vector<RankLags> ranks_;
};

// Compares the replica fingerprints (ReplicaFingerprint) of each step
// across the ranks of a round. Once every rank reported a step: either all
// agree, or the ranks whose fingerprints differ from the majority's are
// named (with the tensors that differ), or, with no majority (two ranks, a
// tie), every rank is. Steps are matched within the newest kStepWindow
// steps reported (a heartbeat carries up to 32 fingerprints per rank).
class DivergenceDetector {
 public:
  static constexpr int kStepWindow = 64;
  // At most this many differing tensors are named.
  static constexpr int kMaxNamedTensors = 16;

  explicit DivergenceDetector(int world_size);

  // What a complete step showed.
  struct Outcome {
    int64_t step = 0;
    // Unset when every rank agreed.
    std::optional<v1::Divergence> divergence;
    // Whether a majority agreed (the diverged ranks are the others).
    bool majority = true;
  };

  // Takes `rank`'s fingerprint. When it completes its step (every rank
  // reported it): the outcome; nullopt otherwise (also for a step older
  // than the window, or reported twice).
  std::optional<Outcome> Observe(int rank, const v1::ReplicaFingerprint& f);

 private:
  struct StepSlot {
    int reported = 0;
    std::vector<std::optional<std::vector<uint64_t>>> tensors;  // by rank
  };
  Outcome Compare(int64_t step, const StepSlot& slot) const;
  std::string TensorName(int index) const;

  const int world_size_;
  std::map<int64_t, StepSlot> steps_;  // by step, the newest kStepWindow
  // The tensors' names, from the first fingerprint that carried them.
  std::vector<std::string> names_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HEALTH_DETECTORS_H_
