#include "worker/launch/torchrun_env.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_config.h"
#include "worker/runtime/thread_stacks.h"

namespace gradsync {

std::map<std::string, std::string> TorchrunVariables(
    const v1::Assignment& a, const AgentContext& c) {
  std::map<std::string, std::string> variables = {
      {"RANK", absl::StrCat(a.rank())},
      {"LOCAL_RANK", absl::StrCat(a.local_rank())},
      {"WORLD_SIZE", absl::StrCat(a.world_size())},
      {"LOCAL_WORLD_SIZE", absl::StrCat(a.local_world_size())},
      {"GROUP_RANK", absl::StrCat(a.node_rank())},
      {"GROUP_WORLD_SIZE", absl::StrCat(a.num_nodes())},
      {"ROLE_RANK", absl::StrCat(a.rank())},
      {"ROLE_WORLD_SIZE", absl::StrCat(a.world_size())},
      {"ROLE_NAME", c.role},
      {"MASTER_ADDR", c.master_addr},
      {"MASTER_PORT", absl::StrCat(c.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", absl::StrCat(c.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", absl::StrCat(c.max_restarts)},
      {"TORCHELASTIC_RUN_ID", a.job_id()},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"GRADSYNC_COORDINATOR", c.coordinator},
      {"GRADSYNC_JOB", a.job_id()},
      {"GRADSYNC_ROUND", absl::StrCat(a.round())},
      {"GRADSYNC_BACKEND", BackendName(a.backend())},
  };
  if (!c.agent_socket.empty()) {
    variables["GRADSYNC_AGENT_SOCKET"] = c.agent_socket;
  }
  if (!c.stacks_dir.empty()) {
    variables["GRADSYNC_STACKS_FILE"] = StacksFile(c, a.local_rank());
    variables["GRADSYNC_STACKS_SIGNAL"] = absl::StrCat(ThreadStackSignal());
  }
  return variables;
}

std::string StacksFile(const AgentContext& context, int local_rank) {
  return absl::StrCat(context.stacks_dir, "/stacks-", local_rank);
}

std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::map<std::string, std::string>& variables, int nproc_per_node) {
  std::map<std::string, std::string> merged;
  for (const std::string& entry : base) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    merged[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  // Unless set.
  if (nproc_per_node > 1) merged.emplace("OMP_NUM_THREADS", "1");
  merged.emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  merged.emplace("MALLOC_MMAP_THRESHOLD_", "33554432");
  merged.emplace("MALLOC_TRIM_THRESHOLD_", "1073741824");
  for (const auto& [name, value] : variables) merged[name] = value;
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const auto& [name, value] : merged) {
    out.push_back(absl::StrCat(name, "=", value));
  }
  return out;
}

std::string PackagedPythonPath(const std::string& executable) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path exe = fs::weakly_canonical(executable, error);
  if (error) return "";
  const fs::path prefix = exe.parent_path().parent_path();
  if (prefix.empty() || prefix == "/usr") return "";
  const fs::path folder = prefix / "lib" / "python3" / "dist-packages";
  if (!fs::is_regular_file(folder / "gradsync" / "__init__.py", error)) {
    return "";
  }
  return folder.string();
}

std::vector<std::string> WithPythonPath(std::vector<std::string> environment,
                                        const std::string& folder) {
  if (folder.empty()) return environment;
  for (std::string& entry : environment) {
    if (!absl::StartsWith(entry, "PYTHONPATH=")) continue;
    const std::string value = entry.substr(sizeof("PYTHONPATH=") - 1);
    for (absl::string_view part : absl::StrSplit(value, ':')) {
      if (part == folder) return environment;
    }
    entry = value.empty() ? absl::StrCat("PYTHONPATH=", folder)
                          : absl::StrCat(entry, ":", folder);
    return environment;
  }
  environment.push_back(absl::StrCat("PYTHONPATH=", folder));
  return environment;
}

}  // namespace gradsync
