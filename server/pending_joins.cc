#include "server/pending_joins.h"

#include <algorithm>
#include <utility>

namespace gradsync {

PendingJoins::Iterator PendingJoins::Add(Joiner joiner) {
  if (++per_node_[joiner.node.node_id()] == nproc_) ++complete_nodes_;
  Iterator it = joiners_.insert(joiners_.end(), std::move(joiner));
  by_ticket_[it->ticket] = it;
  by_incarnation_[it->node.incarnation_id()] = it;
  return it;
}

Joiner PendingJoins::Take(Iterator it) {
  auto count = per_node_.find(it->node.node_id());
  if (count->second == nproc_) --complete_nodes_;
  if (--count->second == 0) per_node_.erase(count);
  by_ticket_.erase(it->ticket);
  by_incarnation_.erase(it->node.incarnation_id());
  Joiner joiner = std::move(*it);
  joiners_.erase(it);
  return joiner;
}

PendingJoins::Iterator PendingJoins::FindTicket(uint64_t ticket) {
  auto found = by_ticket_.find(ticket);
  return found == by_ticket_.end() ? joiners_.end() : found->second;
}

PendingJoins::Iterator PendingJoins::FindIncarnation(
    const std::string& incarnation_id) {
  auto found = by_incarnation_.find(incarnation_id);
  return found == by_incarnation_.end() ? joiners_.end() : found->second;
}

PendingJoins::Iterator PendingJoins::OldestOf(const std::string& node_id) {
  return std::find_if(joiners_.begin(), joiners_.end(), [&](const Joiner& j) {
    return j.node.node_id() == node_id;
  });
}

int PendingJoins::Waiting(const std::string& node_id) const {
  auto count = per_node_.find(node_id);
  return count == per_node_.end() ? 0 : count->second;
}

}  // namespace gradsync
