// gradsync-coordinator: the gradsync coordinator service.
//
//   gradsync-coordinator --listen=0.0.0.0:29400
//
// Stops gracefully on SIGINT or SIGTERM.
#include <signal.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "server/coordinator.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:29400",
          "HOST:PORT to serve gRPC on (port 0 picks a free port)");
ABSL_FLAG(absl::Duration, poll_interval, absl::Milliseconds(10),
          "resolution of timeouts (last call, join, key waits)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "how long in-flight calls may finish on shutdown");
ABSL_FLAG(std::string, port_file, "",
          "if set, write the bound port to this file once serving (for "
          "scripts that start the coordinator on port 0)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gradsync coordinator: rendezvous, key-value store and job status for "
      "data-parallel training.\nUsage: gradsync-coordinator "
      "--listen=HOST:PORT");
  absl::ParseCommandLine(argc, argv);
  // Debian's abseil checks every mutex acquisition for lock-order cycles
  // (gRPC's own mutexes included): about 15% of the coordinator's CPU under
  // load. Tests keep the check; the service does not need it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Block the stop signals in every thread; a dedicated thread waits for
  // them, so no work happens in a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  gradsync::CoordinatorConfig config;
  config.listen_address = absl::GetFlag(FLAGS_listen);
  config.poll_interval = absl::GetFlag(FLAGS_poll_interval);
  config.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  gradsync::Coordinator coordinator(config);
  absl::Status started = coordinator.Start();
  if (!started.ok()) {
    GS_LOG(ERROR) << "cannot start: " << started;
    return EXIT_FAILURE;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    FILE* f = std::fopen(port_file.c_str(), "w");
    if (f == nullptr || std::fprintf(f, "%d\n", coordinator.port()) < 0 ||
        std::fclose(f) != 0) {
      GS_LOG(ERROR) << "cannot write the port to " << port_file;
      return EXIT_FAILURE;
    }
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  GS_LOG(INFO) << "received " << strsignal(signal_number);
  coordinator.Shutdown();
  return EXIT_SUCCESS;
}
