// A round's placement decisions, apart from the rendezvous's state: what
// every assignment of a round shares and each member's assignment, the
// backend, where the round resumes, and a node's processes in local-rank
// order. Pure functions; thread-safe.
#ifndef GRADSYNC_SERVER_ROUND_PLACEMENT_H_
#define GRADSYNC_SERVER_ROUND_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "server/local_placement.h"

namespace gradsync {

// What every member's assignment of one round shares.
struct RoundShape {
  int64_t round = 0;
  int world_size = 0;
  int num_nodes = 0;
  v1::Backend backend = v1::BACKEND_UNSPECIFIED;
  int64_t resume_step = 0;
  int source_rank = 0;
  // Whether some member holds training state (the round goes on from
  // resume_step in place); false when every process starts afresh.
  bool resumed_in_place = false;
  bool single_host = false;
};

// The assignment of rank `rank` (on node `node_rank`) in a round of `shape`
// of the job `config` describes.
v1::Assignment AssignmentFor(const v1::JobConfig& config,
                             const RoundShape& shape, int rank, int node_rank);

// Whether every process runs on one (named) host.
bool OnOneHost(const std::vector<v1::NodeDescriptor>& nodes);

// The backend a round uses: NCCL when every member can use it (or the job
// forces it), GLOO otherwise.
v1::Backend NegotiateBackend(v1::Backend preference,
                             const std::vector<v1::NodeDescriptor>& members);

// Where a round resumes: the most steps committed among `joins` that hold
// state, and the first such member (by index) as the source; (0, 0) when
// none holds state. `joins` are (has_state, committed_step) in rank order.
std::pair<int64_t, int> ChooseResumeSource(
    const std::vector<std::pair<bool, int64_t>>& joins);

// One process waiting to join, as placement sees it.
struct PlacementCandidate {
  std::string node_id;
  const v1::NodeDescriptor* node = nullptr;  // must outlive the placement
  int local_slot = -1;  // the local rank it asks to keep; -1: none
  bool has_state = false;
  int64_t committed_step = 0;
};

// Which waiting processes form round `round` of the job `config` describes,
// and how.
struct Placement {
  // The chosen nodes: their ids, node ranks and processes (indexes into the
  // candidates) in local-rank order.
  std::vector<std::string> nodes;
  std::vector<int> node_rank;
  std::vector<std::vector<int>> processes;
  RoundShape shape;
};

// Places the next round: complete nodes only (nproc_per_node processes
// each), the nodes of the superseded round (`returning`) first, then the
// others in the order their first process joined, up to max_nodes; a node
// keeps its node rank from `remembered_node_rank` when that rank is free,
// the others take the free ranks in order; local ranks by PlaceLocalRanks;
// the backend by NegotiateBackend, the resume source by ChooseResumeSource.
// `candidates` are in join order; a round of no node has world size 0.
Placement PlaceRound(
    const v1::JobConfig& config, int64_t round,
    const std::vector<PlacementCandidate>& candidates,
    const absl::flat_hash_set<std::string>& returning,
    const absl::flat_hash_map<std::string, int>& remembered_node_rank);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_ROUND_PLACEMENT_H_
