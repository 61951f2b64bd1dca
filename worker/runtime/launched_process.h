// The contract between `gradsync launch` and a gradsync-aware process it
// starts (gradsync-worker): the agent joins for the process and hands it its
// join request and first assignment in the environment; the process trains
// and heartbeats on its own from there, rejoining by itself when its round
// is superseded. A process the agent restarts gets a fresh join request and
// no assignment: it joins on its own and takes the lost rank's place.
//
//   GRADSYNC_COORDINATOR    the coordinator's address
//   GRADSYNC_JOIN_REQUEST   base64 of the serialized v1::JoinRequest
//   GRADSYNC_ASSIGNMENT     base64 of the serialized v1::Assignment (absent
//                           for a restarted process)
#ifndef GRADSYNC_WORKER_RUNTIME_LAUNCHED_PROCESS_H_
#define GRADSYNC_WORKER_RUNTIME_LAUNCHED_PROCESS_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"

namespace gradsync {

struct LaunchedProcess {
  std::string coordinator;
  // The process's join request (its node descriptor's pid is the process's).
  v1::JoinRequest request;
  // The first round's assignment, when the agent joined for the process.
  std::optional<v1::Assignment> assignment;
};

// The variables the agent sets for a process joining with `request`
// (`assignment`: its first assignment, or null for a restarted process).
std::map<std::string, std::string> LaunchedProcessVariables(
    const std::string& coordinator, const v1::JoinRequest& request,
    const v1::Assignment* assignment);

// What the agent handed this process; nullopt when it was not started by
// `gradsync launch` (GRADSYNC_JOIN_REQUEST unset). INVALID_ARGUMENT for
// variables that do not decode.
absl::StatusOr<std::optional<LaunchedProcess>> LaunchedProcessFromEnvironment();

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_LAUNCHED_PROCESS_H_
