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

// Runs `agent` (NodeAgent or SelfManagedAgent) to its exit code while a
// thread of its own takes `stop_signals` (blocked in every thread) and
// stops it.
template <typename Agent>
int RunStoppable(Agent* agent, sigset_t stop_signals) {
  // The signal thread ends on a stop signal, or on SIGUSR1 from here once
  // the agent is done.
  sigaddset(&stop_signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::thread signals([agent, stop_signals] {
    int signal = 0;
    while (sigwait(&stop_signals, &signal) == 0) {
      if (signal == SIGUSR1) return;
      GS_LOG(WARNING) << "gradsync launch: received " << strsignal(signal)
                      << ": stopping the processes";
      agent->RequestStop(signal);
    }
  });
  const int code = agent->Run();
  pthread_kill(signals.native_handle(), SIGUSR1);
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
  // SIGINT and SIGTERM are blocked in every thread (those made from here
  // on inherit the mask) and taken by one, which stops the agent. The
  // processes it starts unblock them (LocalProcess::Start).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

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
