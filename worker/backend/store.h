// The key-value store a backend bootstraps through (Gloo's rendezvous, NCCL's
// unique id). CoordinatorStore is the real one; InMemoryStore serves ranks
// that are threads of one test process.
#ifndef GRADSYNC_WORKER_BACKEND_STORE_H_
#define GRADSYNC_WORKER_BACKEND_STORE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

// Implementations are thread-safe.
class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key` to exist, then returns its value.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;
  // Waits up to `timeout` for every key (DEADLINE_EXCEEDED naming them).
  virtual absl::Status Wait(const std::vector<std::string>& keys,
                            absl::Duration timeout) = 0;
};

// A Store in one process's memory. Thread-safe.
class InMemoryStore final : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_STORE_H_
