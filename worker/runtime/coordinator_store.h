#ifndef GRADSYNC_WORKER_RUNTIME_COORDINATOR_STORE_H_
#define GRADSYNC_WORKER_RUNTIME_COORDINATOR_STORE_H_

#include <string>
#include <vector>

#include "proto/gradsync/v1/kv.pb.h"
#include "worker/backend/store.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {

// A Store backed by the coordinator's key-value store, in one job round
// (keys vanish when the round ends, and a stale round's calls fail with
// ABORTED). It lives in the runtime, not beside the backends, because it
// talks to the coordinator: backends see only the Store interface (as Gloo
// keeps its stores apart from its transports). Keys are prefixed with
// `prefix`, so several backends of one round can bootstrap side by side.
// Thread-safe; `client` must outlive it.
class CoordinatorStore final : public Store {
 public:
  CoordinatorStore(CoordinatorClient* client, v1::Scope scope,
                   std::string prefix)
      : client_(client), scope_(std::move(scope)), prefix_(std::move(prefix)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;

 private:
  CoordinatorClient* const client_;
  const v1::Scope scope_;
  const std::string prefix_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_RUNTIME_COORDINATOR_STORE_H_
