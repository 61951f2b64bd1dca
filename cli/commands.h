// The `gradsync` command's commands (jobs, status, watch, create, token), as
// functions of a CoordinatorClient, their options and two streams, so that
// they run the same from main() and from tests (on FakeCoordinatorClient).
// Exit codes: 0 done, 1 the coordinator refused or failed, 2 bad usage.
#ifndef GRADSYNC_CLI_COMMANDS_H_
#define GRADSYNC_CLI_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {

// What the command line said besides the command and its arguments.
struct CommandOptions {
  bool json = false;          // JSON instead of tables
  std::string nnodes = "1";   // create: N or MIN:MAX
  int nproc_per_node = 1;     // create
  absl::Duration interval = absl::Seconds(1);  // watch: between updates
  std::string ranks;          // status/watch: FIRST-LAST, or empty
  bool unhealthy = false;     // status/watch: the unhealthy members only
  bool all = false;           // status/watch: every member
  // watch: each update replaces the one before (a terminal).
  bool redraw = false;
};

// The usage text, for --help and bad usage.
extern const char kCommandUsage[];

// Runs `args` (the command and its arguments, e.g. {"status", "train"})
// against `client`, writing results to `out` and errors to `err`; returns
// the exit code.
int RunCommand(const std::vector<std::string>& args,
               const CommandOptions& options, CoordinatorClient* client,
               std::ostream& out, std::ostream& err);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_COMMANDS_H_
