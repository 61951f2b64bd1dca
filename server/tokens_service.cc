#include "server/tokens_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {

TokensService::TokensService(const JobManager* jobs, Authenticator* auth)
    : jobs_(jobs), auth_(auth) {}

absl::Status TokensService::Check(const grpc::ServerContextBase& context,
                                  const std::string& job_id) const {
  GS_ASSIGN_OR_RETURN(Caller caller, auth_->Identify(context));
  if (!caller.admin) {
    return absl::PermissionDeniedError(
        "only the admin rotates or revokes job tokens (its token, "
        "--admin_token_file)");
  }
  if (!auth_->enabled()) {
    return absl::FailedPreconditionError(
        "this coordinator runs without tokens (--auth=none): there is no "
        "token to rotate or revoke");
  }
  GS_RETURN_IF_ERROR(ValidateJobId(job_id));
  if (!jobs_->Exists(job_id)) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* TokensService::RotateToken(
    grpc::CallbackServerContext* context, const v1::RotateTokenRequest* request,
    v1::RotateTokenResponse* response) {
  absl::Status status = Check(*context, request->job_id());
  if (status.ok()) {
    absl::StatusOr<std::string> token = auth_->IssueToken(request->job_id());
    if (token.ok()) {
      response->set_token(*std::move(token));
      GS_LOG(INFO) << "job '" << request->job_id()
                   << "': token rotated by the admin";
    }
    status = token.status();
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* TokensService::RevokeToken(
    grpc::CallbackServerContext* context, const v1::RevokeTokenRequest* request,
    v1::RevokeTokenResponse* /*response*/) {
  absl::Status status = Check(*context, request->job_id());
  if (status.ok()) {
    status = auth_->Forget(request->job_id());
    if (status.ok()) {
      GS_LOG(INFO) << "job '" << request->job_id()
                   << "': token revoked by the admin";
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace gradsync
