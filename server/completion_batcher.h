// CompletionBatcher: records members' completions (Monitor.ReportCompletion)
// in batches on its own thread. The completions that arrive while a batch is
// being recorded go together in the next, one durable write per job per
// batch (HealthManager::ReportCompletions), so that a job of N members
// ending makes about N / (completions per commit) writes instead of N, and
// gRPC's callback threads (as few as the machine's cores) never wait on
// storage: on them a completion that blocked for its commit held up every
// other callback call of the coordinator (key-value calls of other jobs
// too) for as long as a large job took to end.
//
// Thread-safe. The destructor records what is queued, answers it, and stops
// the thread; `health` must outlive it.
#ifndef GRADSYNC_SERVER_COMPLETION_BATCHER_H_
#define GRADSYNC_SERVER_COMPLETION_BATCHER_H_

#include <cstddef>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/gradsync/v1/health.pb.h"
#include "server/health_manager.h"

namespace gradsync {

class CompletionBatcher {
 public:
  // Called once with ReportCompletion's answer, on the batcher's thread
  // (or the destructor's), without locks held.
  using Done = std::function<void(absl::StatusOr<v1::JobState>)>;

  // At most this many completions go into one batch (a member's change is
  // about 100 bytes: a batch's write of one job stays far below etcd's
  // request limit).
  static constexpr size_t kMaxBatch = 1000;

  explicit CompletionBatcher(HealthManager* health);
  ~CompletionBatcher();
  CompletionBatcher(const CompletionBatcher&) = delete;
  CompletionBatcher& operator=(const CompletionBatcher&) = delete;

  // Queues `request`; `done` gets its answer once it is recorded.
  void Report(v1::ReportCompletionRequest request, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    v1::ReportCompletionRequest request;
    Done done;
  };

  // Records the batches until stopped and nothing is queued.
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Records `batch` and answers each of it.
  void Record(std::vector<Queued> batch);

  HealthManager* const health_;
  absl::Mutex mu_;
  std::vector<Queued> queued_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_COMPLETION_BATCHER_H_
