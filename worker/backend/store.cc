#include "worker/backend/store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {

absl::Status InMemoryStore::Set(const std::string& key,
                                const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key,
                                               absl::Duration timeout) {
  absl::Status waited = Wait({key}, timeout);
  if (!waited.ok()) return waited;
  absl::MutexLock lock(&mu_);
  return values_.at(key);
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys,
                                 absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto all_present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& key : keys) {
      if (values_.count(key) == 0) return false;
    }
    return true;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&all_present), timeout)) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (values_.count(key) == 0) missing.push_back(key);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("waited ", absl::FormatDuration(timeout),
                     " for keys; missing: ", absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
