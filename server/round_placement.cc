#include "server/round_placement.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "server/join_request.h"
#include "server/kv_manager.h"

namespace gradsync {
namespace {

// Node ranks of `nodes`: each keeps its remembered one when that is free
// (below the node count, not taken by a node before it); the others take
// the free ranks in order.
std::vector<int> NodeRanks(
    const std::vector<std::string>& nodes,
    const absl::flat_hash_map<std::string, int>& remembered) {
  const int n = static_cast<int>(nodes.size());
  std::vector<int> rank(n, -1);
  std::vector<bool> taken(n, false);
  for (int i = 0; i < n; ++i) {
    auto old = remembered.find(nodes[i]);
    if (old != remembered.end() && old->second >= 0 && old->second < n &&
        !taken[old->second]) {
      rank[i] = old->second;
      taken[old->second] = true;
    }
  }
  int next_free = 0;
  for (int i = 0; i < n; ++i) {
    if (rank[i] >= 0) continue;
    while (taken[next_free]) ++next_free;
    rank[i] = next_free;
    taken[next_free] = true;
  }
  return rank;
}

}  // namespace

v1::Assignment AssignmentFor(const v1::JobConfig& config,
                             const RoundShape& shape, int rank,
                             int node_rank) {
  const int nproc = config.nproc_per_node();
  v1::Assignment a;
  a.set_job_id(config.job_id());
  a.set_round(shape.round);
  a.set_rank(rank);
  a.set_local_rank(rank % nproc);
  a.set_world_size(shape.world_size);
  a.set_local_world_size(nproc);
  a.set_node_rank(node_rank);
  a.set_num_nodes(shape.num_nodes);
  a.set_backend(shape.backend);
  a.set_kv_prefix(KvRoundPrefix(config.job_id(), shape.round));
  a.set_resume_step(shape.resume_step);
  a.set_source_rank(shape.source_rank);
  a.set_failure_policy(config.failure_policy() == v1::FAILURE_POLICY_FAIL
                           ? v1::FAILURE_POLICY_FAIL
                           : v1::FAILURE_POLICY_RECOVER);
  a.set_single_host(shape.single_host);
  a.set_may_grow(shape.num_nodes < config.max_nodes());
  a.set_may_rebalance(config.straggler_policy() !=
                      v1::STRAGGLER_POLICY_REPORT);
  return a;
}

bool OnOneHost(const std::vector<v1::NodeDescriptor>& nodes) {
  return !nodes.empty() && !nodes.front().hostname().empty() &&
         std::all_of(nodes.begin(), nodes.end(),
                     [&](const v1::NodeDescriptor& d) {
                       return d.hostname() == nodes.front().hostname();
                     });
}

v1::Backend NegotiateBackend(v1::Backend preference,
                             const std::vector<v1::NodeDescriptor>& members) {
  if (preference == v1::BACKEND_GLOO || preference == v1::BACKEND_NCCL) {
    return preference;
  }
  // One kind of device: simulated GPUs cannot reach real ones.
  bool all_nccl =
      !members.empty() &&
      std::all_of(members.begin(), members.end(),
                  [&](const v1::NodeDescriptor& node) {
                    return CanUseNccl(node) &&
                           node.device_type() == members[0].device_type();
                  });
  return all_nccl ? v1::BACKEND_NCCL : v1::BACKEND_GLOO;
}

std::pair<int64_t, int> ChooseResumeSource(
    const std::vector<std::pair<bool, int64_t>>& joins) {
  std::pair<int64_t, int> best = {0, 0};
  bool found = false;
  for (size_t i = 0; i < joins.size(); ++i) {
    const auto& [has_state, step] = joins[i];
    if (!has_state || (found && step <= best.first)) continue;
    best = {step, static_cast<int>(i)};
    found = true;
  }
  return best;
}

Placement PlaceRound(
    const v1::JobConfig& config, int64_t round,
    const std::vector<PlacementCandidate>& candidates,
    const absl::flat_hash_set<std::string>& returning,
    const absl::flat_hash_map<std::string, int>& remembered_node_rank) {
  const int nproc = config.nproc_per_node();
  // The nodes in the order their first process joined, with their processes.
  std::vector<std::string> node_order;
  absl::flat_hash_map<std::string, std::vector<int>> of_node;
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::vector<int>& list = of_node[candidates[i].node_id];
    if (list.empty()) node_order.push_back(candidates[i].node_id);
    list.push_back(static_cast<int>(i));
  }
  Placement placement;
  for (bool back : {true, false}) {
    for (const std::string& node_id : node_order) {
      if (static_cast<int>(placement.nodes.size()) == config.max_nodes()) break;
      if (static_cast<int>(of_node[node_id].size()) == nproc &&
          returning.contains(node_id) == back) {
        placement.nodes.push_back(node_id);
      }
    }
  }
  const int num_nodes = static_cast<int>(placement.nodes.size());
  placement.node_rank = NodeRanks(placement.nodes, remembered_node_rank);

  std::vector<v1::NodeDescriptor> descriptors;
  std::vector<std::pair<bool, int64_t>> states(num_nodes * nproc);
  for (int i = 0; i < num_nodes; ++i) {
    const std::vector<int>& procs = of_node[placement.nodes[i]];
    std::vector<int> slots;
    for (int p : procs) slots.push_back(candidates[p].local_slot);
    const std::vector<int> local = PlaceLocalRanks(slots, nproc);
    std::vector<int> ordered(procs.size());
    for (size_t k = 0; k < procs.size(); ++k) ordered[local[k]] = procs[k];
    for (int l = 0; l < nproc; ++l) {
      const PlacementCandidate& c = candidates[ordered[l]];
      descriptors.push_back(*c.node);
      states[placement.node_rank[i] * nproc + l] = {c.has_state,
                                                    c.committed_step};
    }
    placement.processes.push_back(std::move(ordered));
  }
  RoundShape& shape = placement.shape;
  shape.round = round;
  shape.world_size = num_nodes * nproc;
  shape.num_nodes = num_nodes;
  shape.backend = NegotiateBackend(config.backend(), descriptors);
  std::tie(shape.resume_step, shape.source_rank) = ChooseResumeSource(states);
  shape.resumed_in_place =
      std::any_of(states.begin(), states.end(),
                  [](const std::pair<bool, int64_t>& s) { return s.first; });
  shape.single_host = OnOneHost(descriptors);
  return placement;
}

}  // namespace gradsync
