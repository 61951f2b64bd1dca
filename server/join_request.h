// What a join must carry, checked before the rendezvous changes any state,
// and a node's join split into its processes' joins. Pure functions;
// thread-safe.
#ifndef GRADSYNC_SERVER_JOIN_REQUEST_H_
#define GRADSYNC_SERVER_JOIN_REQUEST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"

namespace gradsync {

// The node a process belongs to: its node_id, or its hostname by default.
const std::string& NodeIdOf(const v1::NodeDescriptor& node);

// "node 'ID' (host H, pid P)", for logs and errors.
std::string DescribeProcess(const v1::NodeDescriptor& node);

// Whether a join carries settings for its job: a config with anything set
// besides the job id. An absent or empty config means "use the job's".
bool HasJobSettings(const v1::JoinRequest& request);

// Whether a process can take part in an NCCL round.
bool CanUseNccl(const v1::NodeDescriptor& node);

// FAILED_PRECONDITION: `request`'s job requires NCCL, which its process
// cannot run.
absl::Status NcclRefusal(const v1::JoinRequest& request);

// Checks a node descriptor from a join; INVALID_ARGUMENT naming the field.
absl::Status ValidateNodeDescriptor(const v1::NodeDescriptor& node);

// Checks one process's join (its node, local slot, committed step and
// rejoin reason), and
// refuses (NcclRefusal) a process that cannot run the NCCL its own settings
// would force on a job they create: a refused join leaves no job behind.
absl::Status CheckProcessJoin(const v1::JoinRequest& request);

// INVALID_ARGUMENT when a node join lists more processes than the job runs
// per node.
absl::Status CheckNodeSize(const std::vector<v1::JoinRequest>& processes,
                           const v1::JobConfig& config);

// A node's join as one JoinRequest per process; INVALID_ARGUMENT for an
// empty list, an incarnation listed twice or processes of several nodes.
absl::StatusOr<std::vector<v1::JoinRequest>> SplitNodeJoin(
    const v1::JoinNodeRequest& request);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOIN_REQUEST_H_
