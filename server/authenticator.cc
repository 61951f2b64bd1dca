#include "server/authenticator.h"

#include <grpcpp/grpcpp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/token_file.h"

namespace gradsync {
namespace {

constexpr char kAuthPrefix[] = "auth/";
constexpr char kBearer[] = "Bearer ";
constexpr int kTokenBytes = 32;

// The SHA-256 of `text`, raw bytes.
std::string Sha256(absl::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<char*>(digest), size);
}

bool SameHash(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

Authenticator::Authenticator(Storage* storage, std::string admin_token)
    : storage_(storage),
      admin_hash_(admin_token.empty() ? "" : Sha256(admin_token)) {}

absl::Status Authenticator::LoadFromStorage() {
  GS_ASSIGN_OR_RETURN(std::vector<Storage::Entry> entries,
                      storage_->Scan(kAuthPrefix, /*keys_only=*/false));
  absl::MutexLock lock(&mu_);
  for (const auto& [key, value] : entries) {
    job_by_hash_[value] = key.substr(sizeof(kAuthPrefix) - 1);
  }
  return absl::OkStatus();
}

absl::StatusOr<Caller> Authenticator::Identify(const std::string* header) const {
  if (!enabled()) return Caller{true, ""};
  if (header == nullptr) {
    return absl::UnauthenticatedError(
        "this coordinator requires a token: pass the job's token "
        "(--token_file or GRADSYNC_TOKEN)");
  }
  if (!absl::StartsWith(*header, kBearer) ||
      header->size() == sizeof(kBearer) - 1) {
    return absl::UnauthenticatedError(
        "malformed authorization metadata: expected 'Bearer TOKEN'");
  }
  const std::string hash = Sha256(absl::string_view(*header).substr(
      sizeof(kBearer) - 1));
  if (SameHash(hash, admin_hash_)) return Caller{true, ""};
  // Found by its hash: how long the lookup takes tells nothing about how
  // much of a token was right.
  absl::MutexLock lock(&mu_);
  auto job = job_by_hash_.find(hash);
  if (job == job_by_hash_.end()) {
    return absl::UnauthenticatedError("unknown token");
  }
  return Caller{false, job->second};
}

absl::StatusOr<Caller> Authenticator::Identify(
    const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto found = metadata.find("authorization");
  if (found == metadata.end()) return Identify(nullptr);
  const std::string header(found->second.data(), found->second.size());
  return Identify(&header);
}

absl::Status Authenticator::Authorize(const Caller& caller,
                                      absl::string_view job_id) {
  if (caller.admin || caller.job_id == job_id) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "this token is for job '", caller.job_id, "', not job '", job_id, "'"));
}

absl::Status Authenticator::Check(const grpc::ServerContextBase& context,
                                  absl::string_view job_id) const {
  GS_ASSIGN_OR_RETURN(Caller caller, Identify(context));
  return Authorize(caller, job_id);
}

grpc::ServerUnaryReactor* Authenticator::Refuse(
    grpc::CallbackServerContext* context, absl::string_view job_id) const {
  absl::Status allowed = Check(*context, job_id);
  if (allowed.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(allowed));
  return reactor;
}

absl::StatusOr<std::string> Authenticator::IssueToken(const std::string& job_id) {
  if (!enabled()) {
    return absl::FailedPreconditionError("tokens are off (--auth=token)");
  }
  unsigned char bytes[kTokenBytes];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("no randomness for a token");
  }
  const std::string token = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<char*>(bytes), sizeof(bytes)));
  const std::string hash = Sha256(token);
  GS_RETURN_IF_ERROR(storage_->Put(absl::StrCat(kAuthPrefix, job_id), hash));
  absl::MutexLock lock(&mu_);
  for (auto it = job_by_hash_.begin(); it != job_by_hash_.end();) {
    it = it->second == job_id ? job_by_hash_.erase(it) : std::next(it);
  }
  job_by_hash_[hash] = job_id;
  return token;
}

absl::Status Authenticator::Forget(const std::string& job_id) {
  GS_RETURN_IF_ERROR(
      storage_->Delete(absl::StrCat(kAuthPrefix, job_id)).status());
  absl::MutexLock lock(&mu_);
  for (auto it = job_by_hash_.begin(); it != job_by_hash_.end();) {
    it = it->second == job_id ? job_by_hash_.erase(it) : std::next(it);
  }
  return absl::OkStatus();
}

std::vector<std::string> Authenticator::JobsWithTokens() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> jobs;
  for (const auto& [hash, job_id] : job_by_hash_) jobs.push_back(job_id);
  return jobs;
}

absl::StatusOr<std::string> AdminToken(const std::string& mode,
                                       const std::string& file) {
  if (mode == "none") {
    if (!file.empty()) {
      return absl::InvalidArgumentError(
          "--admin_token_file is given but --auth is none: add --auth=token");
    }
    return std::string();
  }
  if (mode != "token") {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth must be none or token, not '", mode, "'"));
  }
  if (file.empty()) {
    return absl::InvalidArgumentError(
        "--auth=token needs --admin_token_file (a file holding the admin's "
        "token)");
  }
  return ReadTokenFile(file, "--admin_token_file");
}

}  // namespace gradsync
