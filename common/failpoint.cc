#include "common/failpoint.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {
namespace {

constexpr absl::string_view kKnown[] = {kFailpointStateTransfer,
                                        kFailpointStep};

// The armed failpoint; `armed` lets a disarmed pass skip the lock.
struct Armed {
  std::atomic<bool> armed{false};
  absl::Mutex mu;
  std::string name ABSL_GUARDED_BY(mu);
  long long passes_left ABSL_GUARDED_BY(mu) = 0;
};

Armed& State() {
  static Armed* state = new Armed();
  return *state;
}

}  // namespace

absl::Status ArmFailpoint(absl::string_view spec) {
  absl::string_view name = spec;
  long long hit = 1;
  const size_t colon = spec.find(':');
  if (colon != absl::string_view::npos) {
    name = spec.substr(0, colon);
    if (!absl::SimpleAtoi(spec.substr(colon + 1), &hit) || hit < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "failpoint '", spec, "': the count after ':' must be a positive "
          "integer"));
    }
  }
  bool known = false;
  for (absl::string_view k : kKnown) known = known || k == name;
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown failpoint '", name, "' (known: ", kFailpointStateTransfer,
        ", ", kFailpointStep, ")"));
  }
  Armed& state = State();
  absl::MutexLock lock(&state.mu);
  state.name = std::string(name);
  state.passes_left = hit;
  state.armed.store(true);
  return absl::OkStatus();
}

void Failpoint(absl::string_view name) {
  Armed& state = State();
  if (!state.armed.load(std::memory_order_relaxed)) return;
  absl::MutexLock lock(&state.mu);
  if (state.name != name || --state.passes_left > 0) return;
  const std::string line = absl::StrCat("failpoint ", name, " hit: exiting with code ",
                                        kFailpointExitCode, "\n");
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  ::_exit(kFailpointExitCode);
}

}  // namespace gradsync
