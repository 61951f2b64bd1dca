#include "server/cancellable_reactor.h"

#include <utility>

namespace gradsync {

void CancellableReactor::SetCancelHandler(std::function<void()> cancel) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      cancel_ = std::move(cancel);
      return;
    }
  }
  cancel();
}

void CancellableReactor::OnCancel() {
  std::function<void()> cancel;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    cancel = std::move(cancel_);
    cancel_ = nullptr;
  }
  if (cancel) cancel();
}

}  // namespace gradsync
