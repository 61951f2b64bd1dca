// A gradsync Store (what a backend bootstraps through) over a torch
// c10d::Store (TCPStore, FileStore, gradsync.torch.Store, a PrefixStore of
// any): the torch process group `gradsync` (process_group.h) bootstraps
// gradsync's backends through the store torch hands a process group.
#ifndef GRADSYNC_WORKER_TORCH_C10D_STORE_H_
#define GRADSYNC_WORKER_TORCH_C10D_STORE_H_

#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "worker/backend/store.h"

namespace gradsync {

// Thread-safe as `store` is. Errors the torch store throws come back as
// UNAVAILABLE naming the call (DEADLINE_EXCEEDED when its message says
// "timeout"). Holds a reference to `store`.
class C10dStore final : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store)
      : store_(std::move(store)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_TORCH_C10D_STORE_H_
