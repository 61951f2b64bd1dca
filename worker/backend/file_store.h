// A Store in the files of one directory, for ranks that share a file system
// but no coordinator: processes forked by a test, and the simulated NCCL
// device's communicator bootstrap (sim_device.h). Set writes a file and
// renames it into place, so a reader sees a value whole or not at all; Get
// and Wait poll for it, backing off from 1 ms to 10 ms.
#ifndef GRADSYNC_WORKER_BACKEND_FILE_STORE_H_
#define GRADSYNC_WORKER_BACKEND_FILE_STORE_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backend/store.h"

namespace gradsync {

// Thread-safe; the directory must exist and outlive the store.
class FileStore final : public Store {
 public:
  // `cancel`, when given, ends a Get or Wait in progress with CANCELLED once
  // it is set (checked at every poll); it must outlive the store.
  explicit FileStore(std::string dir,
                     const std::atomic<bool>* cancel = nullptr);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;

  // Removes `key`'s file (no error when it is already gone).
  void Remove(const std::string& key);

  // A fresh directory under $TEST_TMPDIR, else $TMPDIR, else /tmp, named
  // after `prefix`; INTERNAL when it cannot be made.
  static absl::StatusOr<std::string> MakeDirectory(const std::string& prefix);

 private:
  std::string Path(const std::string& key) const;

  const std::string dir_;
  const std::atomic<bool>* const cancel_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_FILE_STORE_H_
