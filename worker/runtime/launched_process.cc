#include "worker/runtime/launched_process.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

constexpr char kCoordinator[] = "GRADSYNC_COORDINATOR";
constexpr char kJoinRequest[] = "GRADSYNC_JOIN_REQUEST";
constexpr char kAssignment[] = "GRADSYNC_ASSIGNMENT";

std::string Encode(const google::protobuf::Message& message) {
  return absl::Base64Escape(message.SerializeAsString());
}

absl::Status Decode(const char* name, google::protobuf::Message* message) {
  const char* value = std::getenv(name);
  std::string bytes;
  if (value == nullptr || !absl::Base64Unescape(value, &bytes) ||
      !message->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " is not a base64 ", message->GetTypeName(),
        ": was this process started by gradsync launch?"));
  }
  return absl::OkStatus();
}

}  // namespace

std::map<std::string, std::string> LaunchedProcessVariables(
    const std::string& coordinator, const v1::JoinRequest& request,
    const v1::Assignment* assignment) {
  std::map<std::string, std::string> variables = {
      {kCoordinator, coordinator},
      {kJoinRequest, Encode(request)},
  };
  if (assignment != nullptr) variables[kAssignment] = Encode(*assignment);
  return variables;
}

absl::StatusOr<std::optional<LaunchedProcess>>
LaunchedProcessFromEnvironment() {
  if (std::getenv(kJoinRequest) == nullptr) return std::nullopt;
  LaunchedProcess launched;
  const char* coordinator = std::getenv(kCoordinator);
  if (coordinator == nullptr || *coordinator == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat(kJoinRequest, " is set but ", kCoordinator, " is not"));
  }
  launched.coordinator = coordinator;
  absl::Status decoded = Decode(kJoinRequest, &launched.request);
  if (!decoded.ok()) return decoded;
  launched.request.mutable_node()->set_pid(getpid());
  if (std::getenv(kAssignment) != nullptr) {
    v1::Assignment assignment;
    decoded = Decode(kAssignment, &assignment);
    if (!decoded.ok()) return decoded;
    launched.assignment = std::move(assignment);
  }
  return std::optional<LaunchedProcess>(std::move(launched));
}

}  // namespace gradsync
