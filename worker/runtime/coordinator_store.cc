#include "worker/runtime/coordinator_store.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::Status CoordinatorStore::Set(const std::string& key,
                                   const std::string& value) {
  return client_->Set(scope_, absl::StrCat(prefix_, key), value);
}

absl::StatusOr<std::string> CoordinatorStore::Get(const std::string& key,
                                                  absl::Duration timeout) {
  const std::string full_key = absl::StrCat(prefix_, key);
  absl::Status waited = client_->Wait(scope_, {full_key}, timeout);
  if (!waited.ok()) return waited;
  return client_->Get(scope_, full_key);
}

absl::Status CoordinatorStore::Wait(const std::vector<std::string>& keys,
                                    absl::Duration timeout) {
  std::vector<std::string> full_keys;
  full_keys.reserve(keys.size());
  for (const std::string& key : keys) {
    full_keys.push_back(absl::StrCat(prefix_, key));
  }
  return client_->Wait(scope_, full_keys, timeout);
}

}  // namespace gradsync
