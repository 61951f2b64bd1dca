#include "server/share_balancer.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace gradsync {

std::vector<int> BalancedShares(int total, const std::vector<double>& seconds) {
  const int world = static_cast<int>(seconds.size());
  std::vector<int> shares(world, kMinShare);
  // (finish time with one more item, rank), least first.
  using Next = std::pair<double, int>;
  std::priority_queue<Next, std::vector<Next>, std::greater<>> next;
  for (int r = 0; r < world; ++r) next.push({(kMinShare + 1) * seconds[r], r});
  for (int left = total - kMinShare * world; left > 0; --left) {
    const auto [finish, r] = next.top();
    next.pop();
    ++shares[r];
    next.push({finish + seconds[r], r});
  }
  return shares;
}

double ShareBalancer::RankLoad::Mean() const {
  const int n = std::min<int>(count, seconds.size());
  if (n == 0) return 0;
  return std::accumulate(seconds.begin(), seconds.begin() + n, 0.0) / n;
}

ShareBalancer::ShareBalancer(int world_size) : ranks_(world_size) {}

void ShareBalancer::Observe(int rank, int64_t step,
                            const v1::MicroBatchLoad& load) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  RankLoad& r = ranks_[rank];
  if (step <= r.step || load.share() < 1 || load.per_step() < load.share() ||
      !(load.seconds() > 0)) {
    return;
  }
  if (load.share() != r.share || load.per_step() != r.per_step) {
    r = RankLoad();  // another division: start over
    r.share = load.share();
    r.per_step = load.per_step();
  }
  r.step = step;
  if (r.seconds.size() < kWindow) {
    r.seconds.push_back(load.seconds());
  } else {
    r.seconds[r.count % kWindow] = load.seconds();
  }
  ++r.count;
}

std::optional<ShareBalancer::Proposal> ShareBalancer::Decide(
    const std::vector<v1::Straggler>& stragglers) const {
  if (stragglers.empty() || ranks_.empty()) return std::nullopt;
  const int world = static_cast<int>(ranks_.size());
  const int total = ranks_[0].per_step;
  std::vector<int> shares;
  std::vector<double> seconds;
  for (const RankLoad& r : ranks_) {
    if (r.count < kWindow || r.per_step != total) return std::nullopt;
    shares.push_back(r.share);
    seconds.push_back(r.Mean());
  }
  if (std::accumulate(shares.begin(), shares.end(), 0) != total ||
      total < kMinPerRank * world) {
    return std::nullopt;
  }
  const auto slowest = [&](const std::vector<int>& s) {
    double most = 0;
    for (int r = 0; r < world; ++r) most = std::max(most, s[r] * seconds[r]);
    return most;
  };
  Proposal proposal;
  proposal.shares = BalancedShares(total, seconds);
  const double now = slowest(shares);
  const double then = slowest(proposal.shares);
  if (proposal.shares == shares || then > (1 - kMinGain) * now) {
    return std::nullopt;
  }
  const auto [fast, slow] =
      std::minmax_element(seconds.begin(), seconds.end());
  proposal.verdict = absl::StrFormat(
      "rank %d takes %.1fx as long per micro-batch as rank %d: shares %s of "
      "%d (were %s), the slowest rank's compute %.1fms -> %.1fms a step",
      slow - seconds.begin(), *slow / *fast, fast - seconds.begin(),
      absl::StrJoin(proposal.shares, ","), total, absl::StrJoin(shares, ","),
      now * 1e3, then * 1e3);
  return proposal;
}

}  // namespace gradsync
