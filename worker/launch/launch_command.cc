#include "worker/launch/launch_command.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/token_file.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/launch/launch_options.h"
#include "worker/launch/node_agent.h"
#include "worker/launch/self_managed_agent.h"
#include "worker/launch/torchrun_env.h"

extern char** environ;

namespace gradsync {
namespace {

// The signal that wakes RunStoppable's signal thread once the agent is done.
constexpr int kWakeSignal = SIGUSR1;

// Runs `agent` (NodeAgent or SelfManagedAgent) to its exit code while a
// thread of its own takes `stop_signals` and stops it. `stop_signals` and
// kWakeSignal must be blocked in every thread.
template <typename Agent>
int RunStoppable(Agent* agent, const sigset_t& stop_signals) {
  // The signal thread ends on kWakeSignal once the agent is done; one that
  // comes before (from another process) is not the wake-up and is dropped.
  sigset_t awaited = stop_signals;
  sigaddset(&awaited, kWakeSignal);
  absl::Notification done;
  std::thread signals([agent, awaited, &done] {
    for (int signal = 0; sigwait(&awaited, &signal) == 0;) {
      if (signal == kWakeSignal) {
        if (done.HasBeenNotified()) return;
        continue;
      }
      GS_LOG(WARNING) << "gradsync launch: received " << strsignal(signal)
                      << ": stopping the processes";
      agent->RequestStop(signal);
    }
  });
  const int code = agent->Run();
  done.Notify();
  pthread_kill(signals.native_handle(), kWakeSignal);
  signals.join();
  return code;
}

}  // namespace

int RunLaunchCommand(const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("%s\n", kLaunchUsage);
    return 0;
  }
  absl::StatusOr<LaunchOptions> options = ParseLaunchArgs(args);
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  // The stop signals are torchrun's: SIGINT, SIGTERM, and SIGHUP and
  // SIGQUIT (the terminal or the ssh session went away); SIGHUP only when
  // it is not ignored (nohup), so that it stays ignored, by the processes
  // too. They and kWakeSignal are blocked here, before any thread starts, so
  // every thread inherits the mask, and taken by one (RunStoppable), which
  // stops the agent. The processes it starts unblock them
  // (LocalProcess::Start).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGQUIT);
  struct sigaction hangup;
  if (sigaction(SIGHUP, nullptr, &hangup) == 0 &&
      hangup.sa_handler != SIG_IGN) {
    sigaddset(&stop_signals, SIGHUP);
  }
  sigset_t blocked = stop_signals;
  sigaddset(&blocked, kWakeSignal);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);

  ClientOptions client_options;
  client_options.target = options->coordinator;
  client_options.tls = {options->tls_ca, options->tls_cert, options->tls_key};
  absl::StatusOr<std::string> token = ClientToken(options->token_file);
  if (!token.ok()) {
    std::fprintf(stderr, "gradsync launch: %s\n",
                 std::string(token.status().message()).c_str());
    return 2;
  }
  client_options.token = *token;
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      GrpcCoordinatorClient::Create(client_options);
  if (!client.ok()) {
    std::fprintf(stderr, "gradsync launch: %s\n",
                 std::string(client.status().message()).c_str());
    return 2;
  }
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    environment.emplace_back(*entry);
  }
  // The processes talk to the coordinator with the same token.
  if (!token->empty()) environment.push_back("GRADSYNC_TOKEN=" + *token);
  // Python scripts find the gradsync package installed beside this command.
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    environment = WithPythonPath(std::move(environment),
                                 PackagedPythonPath(std::string(exe, n)));
  }
  if (options->self_managed) {
    SelfManagedAgent agent(*std::move(options), client->get(),
                           std::move(environment));
    return RunStoppable(&agent, stop_signals);
  }
  NodeAgent agent(*std::move(options), client->get(), std::move(environment));
  return RunStoppable(&agent, stop_signals);
}

}  // namespace gradsync
