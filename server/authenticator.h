// Authenticator: who a call comes from, and whether it may act in a job
// (--auth=token). The admin (its token from --admin_token_file) may do
// anything, creating jobs included; a job's token, issued when the admin
// creates the job, lets its bearer act only inside that job: join, its
// key-value store, heartbeats and completion, its status. Calls carry the
// token as `authorization: Bearer TOKEN` metadata. Without tokens every
// caller is the admin (today's open coordinator).
//
// Tokens are 256-bit random strings; only their SHA-256 is kept, in
// Storage under "auth/<job_id>". A presented token is hashed and looked up
// by its hash (the admin's compared in constant time), so timing reveals
// nothing of the token. Tokens are never logged.
//
// Thread-safe. `storage` must outlive it.
#ifndef GRADSYNC_SERVER_AUTHENTICATOR_H_
#define GRADSYNC_SERVER_AUTHENTICATOR_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/storage/storage.h"

namespace grpc {
class CallbackServerContext;
class ServerContextBase;
class ServerUnaryReactor;
}

namespace gradsync {

// Who made a call.
struct Caller {
  bool admin = false;
  std::string job_id;  // for a job's token: the job it is for
};

class Authenticator {
 public:
  // `admin_token` empty: no authentication (every caller is the admin).
  Authenticator(Storage* storage, std::string admin_token);

  // Loads the token hashes kept in storage; call once before serving.
  absl::Status LoadFromStorage();

  bool enabled() const { return !admin_hash_.empty(); }

  // The caller of a call with `authorization` metadata value `header`
  // (nullptr when absent). UNAUTHENTICATED for a missing, malformed or
  // unknown token (the message never echoes it).
  absl::StatusOr<Caller> Identify(const std::string* header) const;
  // Identify() from a gRPC call's metadata.
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& context) const;

  // OK when `caller` may act in job `job_id`; PERMISSION_DENIED otherwise
  // (the message names the caller's job, never a token).
  static absl::Status Authorize(const Caller& caller, absl::string_view job_id);

  // Identify() then Authorize(): the check of a call about job `job_id`.
  absl::Status Check(const grpc::ServerContextBase& context,
                     absl::string_view job_id) const;

  // For unary handlers: nullptr when the call may act in job `job_id`,
  // else a reactor already finished with the refusal, to return.
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context,
                                   absl::string_view job_id) const;

  // A fresh token for job `job_id` (replacing its earlier one), with its
  // hash stored. FAILED_PRECONDITION when tokens are off.
  absl::StatusOr<std::string> IssueToken(const std::string& job_id);

  // Removes job `job_id`'s token (its hash, in memory and in storage), so
  // that it authenticates nothing any more: a forgotten job's old token
  // cannot re-create the id (--create_jobs_on_join). A no-op for a job
  // without one.
  absl::Status Forget(const std::string& job_id);

  // The jobs that hold a token.
  std::vector<std::string> JobsWithTokens() const;

 private:
  Storage* const storage_;
  const std::string admin_hash_;  // SHA-256 of the admin token; empty: off
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> job_by_hash_ ABSL_GUARDED_BY(mu_);
};

// The admin token for --auth=`mode` ("none" or "token") and
// --admin_token_file=`file`: "" for none. INVALID_ARGUMENT for another mode,
// a token mode without a file or a file without the mode; the file's
// errors (ReadTokenFile).
absl::StatusOr<std::string> AdminToken(const std::string& mode,
                                       const std::string& file);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_AUTHENTICATOR_H_
