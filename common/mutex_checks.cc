#include "common/mutex_checks.h"

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

bool MutexOrderCheckIsSound() {
#if defined(NDEBUG) && (!defined(ABSL_LTS_RELEASE_VERSION) || \
                        ABSL_LTS_RELEASE_VERSION >= 20240116)
  return false;
#else
  return true;
#endif
}

void ConfigureMutexChecks() {
  if (!MutexOrderCheckIsSound()) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
}

}  // namespace gradsync
