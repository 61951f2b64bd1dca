#include "server/storage/in_memory_storage.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gradsync {

absl::Status InMemoryStorage::Put(absl::string_view key,
                                  absl::string_view value) {
  absl::MutexLock lock(&mu_);
  PutLocked(key, value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStorage::Get(absl::string_view key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("no key '", key, "'"));
  }
  return it->second;
}

absl::StatusOr<bool> InMemoryStorage::Delete(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  return DeleteLocked(key);
}

absl::StatusOr<std::vector<Storage::Entry>> InMemoryStorage::Scan(
    absl::string_view prefix, bool keys_only) const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  for (auto it = entries_.lower_bound(prefix);
       it != entries_.end() && absl::StartsWith(it->first, prefix); ++it) {
    out.emplace_back(it->first, keys_only ? std::string() : it->second);
  }
  return out;
}

absl::StatusOr<int64_t> InMemoryStorage::DeletePrefix(
    absl::string_view prefix) {
  absl::MutexLock lock(&mu_);
  return DeletePrefixLocked(prefix);
}

absl::Status InMemoryStorage::Apply(const std::vector<Mutation>& batch) {
  absl::MutexLock lock(&mu_);
  for (const Mutation& m : batch) {
    switch (m.kind) {
      case Mutation::Kind::kPut:
        PutLocked(m.key, m.value);
        break;
      case Mutation::Kind::kDelete:
        DeleteLocked(m.key);
        break;
      case Mutation::Kind::kDeletePrefix:
        DeletePrefixLocked(m.key);
        break;
    }
  }
  return absl::OkStatus();
}

void InMemoryStorage::PutLocked(absl::string_view key,
                                absl::string_view value) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    entries_.emplace(std::string(key), std::string(value));
  } else {
    it->second.assign(value.data(), value.size());
  }
}

bool InMemoryStorage::DeleteLocked(absl::string_view key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

int64_t InMemoryStorage::DeletePrefixLocked(absl::string_view prefix) {
  auto first = entries_.lower_bound(prefix);
  auto last = first;
  int64_t removed = 0;
  while (last != entries_.end() && absl::StartsWith(last->first, prefix)) {
    ++last;
    ++removed;
  }
  entries_.erase(first, last);
  return removed;
}

}  // namespace gradsync
