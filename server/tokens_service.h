#ifndef GRADSYNC_SERVER_TOKENS_SERVICE_H_
#define GRADSYNC_SERVER_TOKENS_SERVICE_H_

#include <string>

#include "absl/status/status.h"
#include "proto/gradsync/v1/tokens.grpc.pb.h"
#include "server/authenticator.h"
#include "server/job_manager.h"

namespace gradsync {

// gRPC handlers of gradsync.v1.Tokens: the admin rotates or revokes a job's
// token through the Authenticator, for jobs JobManager knows. Thread-safe;
// `jobs` and `auth` must outlive it, and it must outlive the server it is
// registered with.
class TokensService final : public v1::Tokens::CallbackService {
 public:
  TokensService(const JobManager* jobs, Authenticator* auth);

  grpc::ServerUnaryReactor* RotateToken(
      grpc::CallbackServerContext* context,
      const v1::RotateTokenRequest* request,
      v1::RotateTokenResponse* response) override;
  grpc::ServerUnaryReactor* RevokeToken(
      grpc::CallbackServerContext* context,
      const v1::RevokeTokenRequest* request,
      v1::RevokeTokenResponse* response) override;

 private:
  // OK when the caller is the admin, tokens are on and job `job_id` exists;
  // otherwise the error the call answers with (see tokens.proto).
  absl::Status Check(const grpc::ServerContextBase& context,
                     const std::string& job_id) const;

  const JobManager* const jobs_;
  Authenticator* const auth_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_TOKENS_SERVICE_H_
