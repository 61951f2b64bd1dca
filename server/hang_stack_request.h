// HangStackRequest: on a hang verdict, which ranks are asked for the stacks
// of all their threads, which were told, what they answered, and how that
// reads in JobDiagnosis.hang_stacks (threads with identical stacks grouped
// across ranks, the groups only hung ranks have first).
//
// The ranks asked are those furthest behind (at most kMaxBehind) and one
// rank furthest ahead, for contrast. Each rank is told the request once, in
// its next heartbeat answer (HeartbeatResponse.stacks_request), and answers
// once (WorkerMetrics.thread_stacks). The request lasts while the verdict
// does; Clear() forgets it.
//
// Not thread-safe: the monitoring of a round owns one, under its lock.
#ifndef GRADSYNC_SERVER_HANG_STACK_REQUEST_H_
#define GRADSYNC_SERVER_HANG_STACK_REQUEST_H_

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

class HangStackRequest {
 public:
  static constexpr size_t kMaxBehind = 4;
  // At most this many groups are shown (the rest are counted in errors).
  static constexpr int kMaxGroups = 64;

  // A hang verdict: asks the first kMaxBehind of `behind` and `ahead` (-1:
  // none) with `id`, which must be non-zero and differ from the previous
  // request's (a worker answers each id once). Replaces an earlier request
  // and its answers.
  void Ask(int64_t id, std::vector<int> behind, int ahead);
  // Whether a request stands.
  bool asked() const { return id_ != 0; }
  // The verdict is over (progress, or the round ended): forgets the request
  // and its answers.
  void Clear();

  // The id `rank` is to be told in its next heartbeat answer: the request's
  // on the first call for a rank asked, 0 otherwise.
  int64_t Tell(int rank);
  // Records `rank`'s answer; false (ignored) unless it answers the standing
  // request and the rank was asked.
  bool Record(int rank, const v1::ThreadStacks& stacks);

  // What the diagnosis shows (empty when no request stands).
  const v1::HangStacks& view() const { return view_; }

 private:
  bool Asked(int rank) const;
  // Rebuilds view_ from the answers.
  void Group();

  int64_t id_ = 0;
  std::vector<int> behind_;
  int ahead_ = -1;
  std::set<int> told_;
  std::map<int, v1::ThreadStacks> answers_;
  v1::HangStacks view_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HANG_STACK_REQUEST_H_
