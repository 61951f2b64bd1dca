// `gradsync launch`: the node agent as a command (see node_agent.h).
#ifndef GRADSYNC_WORKER_LAUNCH_LAUNCH_COMMAND_H_
#define GRADSYNC_WORKER_LAUNCH_LAUNCH_COMMAND_H_

#include <string>
#include <vector>

namespace gradsync {

// Runs `gradsync launch` with `args` (the words after "launch"); returns
// the process's exit code: the agent's (NodeAgent::Run), or 2 for bad
// usage. Call it from main() before any other thread starts: it routes
// SIGINT, SIGTERM, SIGHUP (unless ignored, as under nohup) and SIGQUIT to a
// thread of its own, which stops the agent, and blocks SIGUSR1, which it
// uses internally, in every thread.
int RunLaunchCommand(const std::vector<std::string>& args);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_LAUNCH_COMMAND_H_
