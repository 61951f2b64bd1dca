#ifndef GRADSYNC_SERVER_STORAGE_IN_MEMORY_STORAGE_H_
#define GRADSYNC_SERVER_STORAGE_IN_MEMORY_STORAGE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/storage/storage.h"

namespace gradsync {

// Storage in a std::map: fast, lost when the process exits. Thread-safe.
class InMemoryStorage final : public Storage {
 public:
  absl::Status Put(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) const override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::StatusOr<std::vector<Entry>> Scan(absl::string_view prefix,
                                          bool keys_only) const override;
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override;
  absl::Status Apply(const std::vector<Mutation>& batch) override;

 private:
  void PutLocked(absl::string_view key, absl::string_view value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DeleteLocked(absl::string_view key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t DeletePrefixLocked(absl::string_view prefix)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STORAGE_IN_MEMORY_STORAGE_H_
