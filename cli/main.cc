// gradsync: the command-line view of a coordinator.
//
//   gradsync --coordinator=HOST:PORT jobs [--json]
//   gradsync --coordinator=HOST:PORT status JOB [--json]
//       [--ranks=FIRST-LAST | --unhealthy | --all]
//   gradsync --coordinator=HOST:PORT watch JOB [--json] [--interval=1s]
//       [--ranks=FIRST-LAST | --unhealthy | --all]
//   gradsync --coordinator=HOST:PORT create JOB --nnodes=N[:M]
//       [--nproc_per_node=P] [--json]   (prints the job's token)
//   gradsync --coordinator=HOST:PORT token rotate|revoke JOB
//       (the admin: a new token for the job, printed; or none)
//   gradsync launch [torchrun-style flags] [--] PROGRAM [ARGS...]
//     (the node agent: worker/launch/node_agent.h; its own flags)
//
// Exit codes: 0 success, 1 the coordinator answered with an error (e.g. an
// unknown job) or could not be reached, 2 bad usage. Errors are one line on
// stderr.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cli/commands.h"
#include "common/logging.h"
#include "common/mutex_checks.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/launch/launch_command.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the coordinator's TLS certificate (empty: "
          "plaintext)");
ABSL_FLAG(std::string, tls_cert, "",
          "with --tls_ca: this client's PEM certificate, for a coordinator "
          "that requires one (--tls_client_ca)");
ABSL_FLAG(std::string, tls_key, "", "the PEM private key of --tls_cert");
ABSL_FLAG(std::string, token_file, "",
          "a file holding the token for a coordinator with --auth=token "
          "(default: $GRADSYNC_TOKEN); `create` needs the admin's");
ABSL_FLAG(std::string, nnodes, "1", "create: nodes per round, N or MIN:MAX");
ABSL_FLAG(int, nproc_per_node, 1, "create: processes per node");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:29400",
          "the coordinator, HOST:PORT; or its replicas (--etcd), "
          "HOST:PORT,HOST:PORT,... (names in a list are resolved to their "
          "IPv4 addresses once, at start)");
ABSL_FLAG(bool, json, false, "print JSON instead of tables");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5),
          "give up when the coordinator does not answer within this time");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(1),
          "watch: refresh at most this often (at least 100ms)");
ABSL_FLAG(std::string, ranks, "",
          "status, watch: list only ranks FIRST-LAST (e.g. 0-63)");
ABSL_FLAG(bool, unhealthy, false,
          "status, watch: list only members that are not ACTIVE or are "
          "stragglers");
ABSL_FLAG(bool, all, false,
          "status, watch: list every member, however large the job (by "
          "default a job of more than 64 ranks lists only its unhealthy "
          "members, after the summary)");

namespace {

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "gradsync: %s\n", message.c_str());
  return code;
}

// The client of the coordinator the flags name; exits with code 2 when the
// token or TLS files cannot be read.
absl::StatusOr<std::unique_ptr<gradsync::CoordinatorClient>> ClientFromFlags() {
  gradsync::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_coordinator);
  options.call_timeout = absl::GetFlag(FLAGS_timeout);
  options.retry.max_attempts = 3;
  options.retry.budget = absl::GetFlag(FLAGS_timeout);
  options.tls = {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                 absl::GetFlag(FLAGS_tls_key)};
  GS_ASSIGN_OR_RETURN(options.token,
                      gradsync::ClientToken(absl::GetFlag(FLAGS_token_file)));
  return gradsync::GrpcCoordinatorClient::Create(options);
}

gradsync::CommandOptions CommandOptionsFromFlags() {
  gradsync::CommandOptions options;
  options.json = absl::GetFlag(FLAGS_json);
  options.nnodes = absl::GetFlag(FLAGS_nnodes);
  options.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  options.interval = absl::GetFlag(FLAGS_interval);
  options.ranks = absl::GetFlag(FLAGS_ranks);
  options.unhealthy = absl::GetFlag(FLAGS_unhealthy);
  options.all = absl::GetFlag(FLAGS_all);
  // On a terminal, each update of `watch` replaces the previous one.
  options.redraw = !options.json && isatty(STDOUT_FILENO);
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  gradsync::ConfigureMutexChecks();
  if (argc > 1 && std::string(argv[1]) == "launch") {
    return gradsync::RunLaunchCommand(
        std::vector<std::string>(argv + 2, argv + argc));
  }
  absl::SetProgramUsageMessage(gradsync::kCommandUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    return Fail(std::string("no command\n") + gradsync::kCommandUsage, 2);
  }
  auto client = ClientFromFlags();
  if (!client.ok()) return Fail(std::string(client.status().message()), 2);
  return gradsync::RunCommand(
      std::vector<std::string>(args.begin() + 1, args.end()),
      CommandOptionsFromFlags(), client->get(), std::cout, std::cerr);
}
