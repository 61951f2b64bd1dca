// A unary callback-API reactor for calls that finish later, from whichever
// thread completes them (a round closing, a key arriving), and that must
// withdraw their pending work when the client goes away.
#ifndef GRADSYNC_SERVER_CANCELLABLE_REACTOR_H_
#define GRADSYNC_SERVER_CANCELLABLE_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

// Lifetime: created with `new` by a handler, which returns it to gRPC and
// calls Release() once it is done setting it up; deleted after both that
// Release() and gRPC's OnDone(). Finish() may be called from any thread,
// exactly once. Thread-safe.
class CancellableReactor final : public grpc::ServerUnaryReactor {
 public:
  CancellableReactor() = default;

  // Runs `cancel` when the client cancels the call or its deadline passes;
  // at once when that already happened. `cancel` must lead to Finish().
  void SetCancelHandler(std::function<void()> cancel);

  // Drops the handler's reference (see class comment).
  void Release() { Unref(); }

  void OnCancel() override;
  void OnDone() override { Unref(); }

 private:
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  std::atomic<int> refs_{2};  // the handler's and gRPC's
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_CANCELLABLE_REACTOR_H_
