// The main() of every gtest binary: gtest's, plus a handler for fatal
// signals (SIGSEGV, SIGABRT from "pure virtual method called" or a failed
// CHECK, ...) that prints the faulting thread's stack, symbolized, before the
// process dies as it would have. A crash seen once in CI can then be
// diagnosed from its log. The stack is unwound with glibc's backtrace()
// (which follows .eh_frame, so it crosses libc and libgrpc frames without
// frame pointers) and named with absl::Symbolize; both are safe to call in
// a signal handler once initialized.
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>

#include "absl/debugging/symbolize.h"
#include "common/mutex_checks.h"
#include "gtest/gtest.h"

namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL};
constexpr int kMaxFrames = 64;
// On the main thread the handler runs on a stack of its own, so a stack
// overflow there is reported too.
constexpr size_t kHandlerStack = 256 * 1024;

void Write(const char* text) {
  ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
  (void)ignored;
}

void PrintStackAndDie(int signal) {
  char line[1200];
  snprintf(line, sizeof(line), "\n*** %s: stack of the thread it hit:\n",
           strsignal(signal));
  Write(line);
  void* frames[kMaxFrames];
  const int depth = backtrace(frames, kMaxFrames);
  for (int i = 0; i < depth; ++i) {
    char name[1024] = "(unknown)";
    absl::Symbolize(frames[i], name, sizeof(name));
    snprintf(line, sizeof(line), "    #%d %p %s\n", i, frames[i], name);
    Write(line);
  }
  // Die of the same signal, as without this handler.
  ::signal(signal, SIG_DFL);
  raise(signal);
}

void InstallCrashHandler(const char* argv0) {
  absl::InitializeSymbolizer(argv0);
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
  static char handler_stack[kHandlerStack];
  stack_t stack = {};
  stack.ss_sp = handler_stack;
  stack.ss_size = sizeof(handler_stack);
  sigaltstack(&stack, nullptr);
  for (int signal : kFatalSignals) {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = PrintStackAndDie;
    action.sa_flags = SA_RESETHAND | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(signal, &action, nullptr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  InstallCrashHandler(argv[0]);
  gradsync::ConfigureMutexChecks();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
