#include "server/connection_limits.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync {

ConnectionLimits::Lease& ConnectionLimits::Lease::operator=(
    Lease&& other) noexcept {
  if (this != &other) {
    Release();
    limits_ = std::exchange(other.limits_, nullptr);
    peer_ = std::move(other.peer_);
  }
  return *this;
}

void ConnectionLimits::Lease::Release() {
  if (limits_ != nullptr) limits_->Release(peer_);
  limits_ = nullptr;
}

absl::StatusOr<ConnectionLimits::Lease> ConnectionLimits::Acquire(
    const std::string& peer) {
  absl::MutexLock lock(&mu_);
  int& open = open_[peer];
  if (max_per_connection_ > 0 && open >= max_per_connection_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this connection holds ", open, " heartbeat streams and watches, the "
        "most one may (--max_streams_per_connection=", max_per_connection_,
        "): end one first, or spread the callers over connections"));
  }
  ++open;
  return Lease(this, peer);
}

int ConnectionLimits::Open(const std::string& peer) const {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(peer);
  return it == open_.end() ? 0 : it->second;
}

void ConnectionLimits::Release(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(peer);
  if (it != open_.end() && --it->second <= 0) open_.erase(it);
}

}  // namespace gradsync
