#include "common/failpoint.h"

#include <unistd.h>

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {
namespace {

constexpr absl::string_view kKnown[] = {
    kFailpointStateTransfer, kFailpointStep, kFailpointNcclAsyncError,
    kFailpointNcclHang, kFailpointCorruptParameters, kFailpointHang};

// The armed failpoints and their passes left (for a step-keyed one, its
// step); `any` lets a pass skip the lock while none is armed.
struct Armed {
  std::atomic<bool> any{false};
  absl::Mutex mu;
  std::map<std::string, long long, std::less<>> passes_left
      ABSL_GUARDED_BY(mu);
};

Armed& State() {
  static Armed* state = new Armed();
  return *state;
}

void WriteStderr(const std::string& line) {
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace

absl::Status ArmFailpoint(absl::string_view spec) {
  std::map<std::string, long long, std::less<>> armed;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    absl::string_view name = item;
    long long hit = 1;
    const size_t colon = item.find(':');
    if (colon != absl::string_view::npos) {
      name = item.substr(0, colon);
      if (!absl::SimpleAtoi(item.substr(colon + 1), &hit) || hit < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "failpoint '", item, "': the count after ':' must be a positive "
            "integer"));
      }
    }
    bool known = false;
    for (absl::string_view k : kKnown) known = known || k == name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown failpoint '", name,
          "' (known: ", absl::StrJoin(kKnown, ", "), ")"));
    }
    if (!armed.emplace(std::string(name), hit).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("failpoint '", name, "' is listed twice in '", spec, "'"));
    }
  }
  Armed& state = State();
  absl::MutexLock lock(&state.mu);
  for (auto& [name, hit] : armed) state.passes_left[name] = hit;
  state.any.store(!state.passes_left.empty());
  return absl::OkStatus();
}

bool FailpointArmed(absl::string_view name) {
  Armed& state = State();
  if (!state.any.load(std::memory_order_relaxed)) return false;
  absl::MutexLock lock(&state.mu);
  return state.passes_left.find(name) != state.passes_left.end();
}

namespace {

// A pass through `name`: true when it fires, after logging
// "failpoint NAME hit" and `what_now`.
bool Pass(absl::string_view name, absl::string_view what_now) {
  Armed& state = State();
  if (!state.any.load(std::memory_order_relaxed)) return false;
  absl::MutexLock lock(&state.mu);
  auto it = state.passes_left.find(name);
  if (it == state.passes_left.end() || --it->second > 0) return false;
  state.passes_left.erase(it);
  WriteStderr(absl::StrCat("failpoint ", name, " hit", what_now, "\n"));
  return true;
}

}  // namespace

bool FailpointFires(absl::string_view name) { return Pass(name, ""); }

bool FailpointFiresAtStep(absl::string_view name, int64_t step) {
  Armed& state = State();
  if (!state.any.load(std::memory_order_relaxed)) return false;
  absl::MutexLock lock(&state.mu);
  auto it = state.passes_left.find(name);
  if (it == state.passes_left.end() || it->second != step) return false;
  state.passes_left.erase(it);
  WriteStderr(absl::StrCat("failpoint ", name, " hit at step ", step, "\n"));
  return true;
}

void Failpoint(absl::string_view name) {
  if (!Pass(name, absl::StrCat(": exiting with code ", kFailpointExitCode))) {
    return;
  }
  ::_exit(kFailpointExitCode);
}

}  // namespace gradsync
