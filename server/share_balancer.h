// ShareBalancer: for a round whose ranks run an exact global batch
// (WorkerMetrics.micro_batches), whether and how each step's micro-batches
// should move among the ranks so that the slowest finishes sooner. Once a
// rank is flagged a straggler (StragglerDetector: its first gradient bucket
// late, consistently), it proposes shares in proportion to the ranks'
// measured speeds (what one micro-batch takes each rank, averaged over its
// recent reports), when they shorten the predicted step by kMinGain or
// more.
// The same rule moves them back when the straggler recovers: the ranks that
// carry its work are then the late ones.
//
// The coordinator switches shares by re-forming the round at a step
// boundary with them in its assignments (Assignment.micro_batch_shares), so
// every rank changes at the same step and the global batch stays exact.
//
// A value type: not thread-safe; the monitoring of a round owns one.
#ifndef GRADSYNC_SERVER_SHARE_BALANCER_H_
#define GRADSYNC_SERVER_SHARE_BALANCER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

// Divides `total` items among ranks whose items take `seconds[r]` each, at
// least kMinShare each (a worker measures its speed on the micro-batches
// before its last, which also synchronizes), so that the largest share x
// time is least: each item in turn goes to the rank that would finish it
// first (ties to the lower rank), which is optimal for identical items.
// Needs total >= kMinShare x seconds.size() and positive times.
inline constexpr int kMinShare = 2;
std::vector<int> BalancedShares(int total, const std::vector<double>& seconds);

class ShareBalancer {
 public:
  // Reports of a rank (one a heartbeat, each already a recent average of
  // its steps) its speed is averaged over, and needed before a proposal.
  static constexpr int kWindow = 4;
  // How much shorter the predicted step must be.
  static constexpr double kMinGain = 0.1;
  // Micro-batches per rank and step below which shares cannot move enough
  // to matter: no proposal.
  static constexpr int kMinPerRank = 4;

  explicit ShareBalancer(int world_size);

  // Takes `rank`'s report of its latest step `step` (ignored when it is not
  // newer than the last one taken, or malformed).
  void Observe(int rank, int64_t step, const v1::MicroBatchLoad& load);

  struct Proposal {
    std::vector<int> shares;  // by rank, summing to the step's micro-batches
    // "rank 2 takes 3.0x as long per micro-batch as rank 0: shares 10,9,5
    // of 24 (were 8,8,8), the slowest rank's compute 24.0ms -> 15.0ms"
    std::string verdict;
  };
  // With stragglers flagged now: a proposal when every rank made kWindow
  // reports with the same shares and step size, and the balanced
  // shares shorten the predicted step by kMinGain or more; nullopt
  // otherwise (also without stragglers).
  std::optional<Proposal> Decide(
      const std::vector<v1::Straggler>& stragglers) const;

 private:
  struct RankLoad {
    int64_t step = 0;  // the last step taken
    int share = 0;
    int per_step = 0;
    std::vector<double> seconds;  // ring of the last kWindow
    int count = 0;                // reports taken
    double Mean() const;
  };
  std::vector<RankLoad> ranks_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_SHARE_BALANCER_H_
