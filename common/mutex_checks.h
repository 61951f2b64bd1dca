// absl::Mutex's lock-order check, set for how this binary was built.
//
// Debian builds abseil without NDEBUG, so its Mutex records the order in
// which every thread takes mutexes and aborts the process ("Potential Mutex
// deadlock") when an acquisition closes a cycle. The graph is keyed by the
// mutex's address, so a mutex must leave it when destroyed. From abseil
// 20240116 the destructor is inline and, in code compiled with NDEBUG (ours:
// Bazel -c opt, CMake Release), empty: a destroyed mutex stays in the graph
// and a new one at the same address inherits its edges. On Debian 13
// (abseil 20240722) that aborted gradsync-worker in a re-formed round over
// mutexes that never deadlock. Debian 12's abseil 20220623 forgets them, and
// there the check stays on (tests rely on it).
#ifndef GRADSYNC_COMMON_MUTEX_CHECKS_H_
#define GRADSYNC_COMMON_MUTEX_CHECKS_H_

namespace gradsync {

// Whether absl::Mutex's lock-order check can be trusted in this build: false
// for code compiled with NDEBUG against abseil 20240116 or later (or an
// abseil without a release number, its development head).
bool MutexOrderCheckIsSound();

// Turns the check off where it cannot be trusted (see above); leaves abseil's
// setting otherwise. Process-wide; call it at the start of main() (or, in a
// Python extension, when the module loads: the setting is an atomic that
// every later acquisition reads).
void ConfigureMutexChecks();

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_MUTEX_CHECKS_H_
