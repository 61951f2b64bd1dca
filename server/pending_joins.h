// PendingJoins: the processes waiting to join one job's next round (or
// waiting as spares while a round runs), in join order, found by ticket and
// by incarnation, and counted per node: a node is complete once
// nproc_per_node of its processes wait, and a round closes over complete
// nodes only (round_placement.h chooses among them).
//
// Not thread-safe: RendezvousManager's lock guards it. Iterators stay valid
// until their joiner is taken.
#ifndef GRADSYNC_SERVER_PENDING_JOINS_H_
#define GRADSYNC_SERVER_PENDING_JOINS_H_

#include <cstdint>
#include <functional>
#include <list>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

// A process waiting for a round to close.
struct Joiner {
  uint64_t ticket = 0;
  v1::NodeDescriptor node;  // node_id filled in
  // What training state the process holds (JoinRequest).
  bool has_state = false;
  int64_t committed_step = 0;
  // The local rank it keeps (JoinRequest.local_slot); -1: none.
  int local_slot = -1;
  absl::Time join_time;
  absl::Time deadline;
  // Answers the join: its assignment, or why it ends without one.
  std::function<void(absl::StatusOr<v1::Assignment>)> done;
};

class PendingJoins {
 public:
  using Iterator = std::list<Joiner>::iterator;
  using ConstIterator = std::list<Joiner>::const_iterator;

  // A node of `nproc_per_node` waiting processes is complete.
  explicit PendingJoins(int nproc_per_node) : nproc_(nproc_per_node) {}

  // Adds `joiner` last. Its ticket and incarnation must not wait already
  // (the manager replaces an older join of the same process first).
  Iterator Add(Joiner joiner);
  // Removes the joiner at `it` and returns it.
  Joiner Take(Iterator it);

  // The joiner of `ticket` / of `incarnation_id`, or end().
  Iterator FindTicket(uint64_t ticket);
  Iterator FindIncarnation(const std::string& incarnation_id);
  // The first of node `node_id`'s waiting processes, or end().
  Iterator OldestOf(const std::string& node_id);

  // How many of node `node_id`'s processes wait.
  int Waiting(const std::string& node_id) const;
  bool NodeComplete(const std::string& node_id) const {
    return Waiting(node_id) >= nproc_;
  }
  // Nodes with nproc_per_node waiting processes.
  int complete_nodes() const { return complete_nodes_; }

  size_t size() const { return joiners_.size(); }
  bool empty() const { return joiners_.empty(); }
  Iterator begin() { return joiners_.begin(); }
  Iterator end() { return joiners_.end(); }
  ConstIterator begin() const { return joiners_.begin(); }
  ConstIterator end() const { return joiners_.end(); }

 private:
  const int nproc_;
  std::list<Joiner> joiners_;  // in join order
  absl::flat_hash_map<uint64_t, Iterator> by_ticket_;
  absl::flat_hash_map<std::string, Iterator> by_incarnation_;
  absl::flat_hash_map<std::string, int> per_node_;
  int complete_nodes_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_PENDING_JOINS_H_
