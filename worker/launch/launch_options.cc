#include "worker/launch/launch_options.h"

#include <unistd.h>

#include <functional>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "worker/backend/sim_device.h"
#include "worker/launch/gpus.h"

namespace gradsync {

const char kLaunchUsage[] =
    "gradsync launch [FLAGS] [--] PROGRAM [ARGS...]\n"
    "  Joins the job's rendezvous for this node and starts its processes\n"
    "  with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,\n"
    "  MASTER_ADDR, MASTER_PORT, ...). PROGRAM.py and -m MODULE run under\n"
    "  python; other programs run directly.\n"
    "  --coordinator=HOST:PORT (or --rdzv_endpoint)   required\n"
    "  --job=ID (or --rdzv_id)                         required\n"
    "  --nnodes=N|MIN:MAX            nodes of a round (default 1)\n"
    "  --nproc_per_node=N|cpu|gpu|auto  processes on this node (default 1)\n"
    "  --device=auto|cpu|sim         the GPUs this node offers its round:\n"
    "                                auto, the NVIDIA GPUs visible; sim,\n"
    "                                $GRADSYNC_SIM_DEVICES simulated ones\n"
    "                                (tests; default 8)\n"
    "  --node_id=ID                  groups this node's processes (default:\n"
    "                                the hostname)\n"
    "  --max_restarts=N              group restarts after a failure (0)\n"
    "  --monitor_interval=SECONDS    how often processes are sampled (1)\n"
    "  --log_dir=DIR --redirects=0-3 --tee=0-3   per-rank log files\n"
    "                                (or per local rank: --tee=0:3,1:2)\n"
    "  --role=NAME                   ROLE_NAME (default)\n"
    "  --address=HOST                this node's address for MASTER_ADDR\n"
    "  --backend=auto|gloo|nccl      what the round negotiates (auto)\n"
    "  --join_timeout=SECONDS        (600)  --stop_timeout=SECONDS (10)\n"
    "  --tls_ca, --tls_cert, --tls_key   TLS toward the coordinator\n"
    "  --token_file=FILE             the job's token (default:\n"
    "                                $GRADSYNC_TOKEN), passed to the processes\n"
    "  --python=PATH (python3)  --no_python  -m/--module\n"
    "  --self_managed                the processes heartbeat and heal on\n"
    "                                their own (implied for gradsync-worker)\n"
    "  Accepted for torchrun compatibility and ignored: --rdzv_backend,\n"
    "  --rdzv_conf, --master_addr, --master_port, --node_rank, --start_method.";

namespace {

absl::Status Bad(const std::string& flag, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("gradsync launch: --", flag, ": ", why));
}

// Seconds as torchrun gives them ("5", "0.5"), or an absl duration ("5s").
absl::StatusOr<absl::Duration> ParseSeconds(const std::string& flag,
                                            const std::string& value) {
  double seconds = 0;
  absl::Duration duration;
  if (absl::SimpleAtod(value, &seconds) && seconds >= 0) {
    return absl::Seconds(seconds);
  }
  if (absl::ParseDuration(value, &duration) &&
      duration >= absl::ZeroDuration()) {
    return duration;
  }
  return Bad(flag, absl::StrCat("'", value, "' is not a duration (seconds)"));
}

absl::StatusOr<int> ParseCount(const std::string& flag,
                               const std::string& value, int min) {
  int n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < min) {
    return Bad(flag, absl::StrCat("'", value, "' is not an integer >= ", min));
  }
  return n;
}

absl::StatusOr<StdStreams> ParseStreamsValue(const std::string& flag,
                                             absl::string_view value) {
  int n = -1;
  if (!absl::SimpleAtoi(value, &n) || n < 0 || n > 3) {
    return Bad(flag, absl::StrCat("'", value,
                                  "' is not 0 (none), 1 (stdout), 2 (stderr) "
                                  "or 3 (both)"));
  }
  return static_cast<StdStreams>(n);
}

// "N", or "LOCAL_RANK:N,LOCAL_RANK:N,...".
absl::StatusOr<StdStreamsSetting> ParseStreams(const std::string& flag,
                                               const std::string& value) {
  StdStreamsSetting setting;
  if (value.find(':') == std::string::npos) {
    absl::StatusOr<StdStreams> all = ParseStreamsValue(flag, value);
    if (!all.ok()) return all.status();
    setting.all = *all;
    return setting;
  }
  for (absl::string_view entry : absl::StrSplit(value, ',')) {
    std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(entry, absl::MaxSplits(':', 1));
    int rank = -1;
    if (!absl::SimpleAtoi(parts.first, &rank) || rank < 0) {
      return Bad(flag, absl::StrCat("'", entry,
                                    "' is not LOCAL_RANK:VALUE"));
    }
    absl::StatusOr<StdStreams> streams = ParseStreamsValue(flag, parts.second);
    if (!streams.ok()) return streams.status();
    setting.by_local_rank[rank] = *streams;
  }
  return setting;
}

absl::StatusOr<LaunchDevice> ParseDevice(const std::string& value) {
  if (value == "auto") return LaunchDevice::kAuto;
  if (value == "cpu") return LaunchDevice::kCpu;
  if (value == "sim") return LaunchDevice::kSim;
  return Bad("device", absl::StrCat("'", value, "' is not auto, cpu or sim"));
}

// `value` of --nproc_per_node, "gpu" and "auto" counting `device`'s GPUs.
absl::StatusOr<int> ParseNproc(const std::string& value, LaunchDevice device) {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (value == "cpu") return static_cast<int>(std::max(1L, cpus));
  if (value != "gpu" && value != "auto") {
    return ParseCount("nproc_per_node", value, 1);
  }
  int gpus = 0;
  if (device == LaunchDevice::kSim) {
    absl::StatusOr<int> sim = SimDeviceCount();
    if (!sim.ok()) return Bad("nproc_per_node", std::string(sim.status().message()));
    gpus = *sim;
  } else if (device == LaunchDevice::kAuto) {
    gpus = CountGpus();
  }
  if (gpus > 0) return gpus;
  if (value == "auto") return static_cast<int>(std::max(1L, cpus));
  return Bad("nproc_per_node",
             device == LaunchDevice::kCpu
                 ? "'gpu' with --device=cpu"
                 : "'gpu', but no NVIDIA GPU is visible "
                   "(/proc/driver/nvidia/gpus; --device=sim for simulated "
                   "ones)");
}

using Setter = std::function<absl::Status(LaunchOptions*, const std::string&)>;

template <typename T>
Setter Assign(T LaunchOptions::*field,
              std::function<absl::StatusOr<T>(const std::string&)> parse) {
  return [field, parse](LaunchOptions* o, const std::string& v) {
    absl::StatusOr<T> parsed = parse(v);
    if (!parsed.ok()) return parsed.status();
    o->*field = *std::move(parsed);
    return absl::OkStatus();
  };
}

Setter Text(std::string LaunchOptions::*field) {
  return Assign<std::string>(
      field, [](const std::string& v) -> absl::StatusOr<std::string> {
        return v;
      });
}

Setter Seconds(absl::Duration LaunchOptions::*field, const std::string& flag) {
  return Assign<absl::Duration>(
      field, [flag](const std::string& v) { return ParseSeconds(flag, v); });
}

Setter Streams(StdStreamsSetting LaunchOptions::*field,
               const std::string& flag) {
  return Assign<StdStreamsSetting>(
      field, [flag](const std::string& v) { return ParseStreams(flag, v); });
}

const std::map<std::string, Setter>& ValueFlags() {
  static const auto* flags = new std::map<std::string, Setter>{
      {"coordinator", Text(&LaunchOptions::coordinator)},
      {"rdzv_endpoint", Text(&LaunchOptions::coordinator)},
      {"job", Text(&LaunchOptions::job)},
      {"rdzv_id", Text(&LaunchOptions::job)},
      {"nnodes", Text(&LaunchOptions::nnodes)},
      {"device", Assign<LaunchDevice>(&LaunchOptions::device, ParseDevice)},
      {"node_id", Text(&LaunchOptions::node_id)},
      {"max_restarts",
       Assign<int>(&LaunchOptions::max_restarts,
                   [](const std::string& v) {
                     return ParseCount("max_restarts", v, 0);
                   })},
      {"monitor_interval",
       Seconds(&LaunchOptions::monitor_interval, "monitor_interval")},
      {"log_dir", Text(&LaunchOptions::log_dir)},
      {"redirects", Streams(&LaunchOptions::redirects, "redirects")},
      {"tee", Streams(&LaunchOptions::tee, "tee")},
      {"role", Text(&LaunchOptions::role)},
      {"address", Text(&LaunchOptions::address)},
      {"backend", Text(&LaunchOptions::backend)},
      {"join_timeout", Seconds(&LaunchOptions::join_timeout, "join_timeout")},
      {"stop_timeout", Seconds(&LaunchOptions::stop_timeout, "stop_timeout")},
      {"tls_ca", Text(&LaunchOptions::tls_ca)},
      {"tls_cert", Text(&LaunchOptions::tls_cert)},
      {"tls_key", Text(&LaunchOptions::tls_key)},
      {"token_file", Text(&LaunchOptions::token_file)},
      {"python", Text(&LaunchOptions::python)},
      // torchrun's own rendezvous: the coordinator does this work.
      {"rdzv_backend", nullptr},
      {"rdzv_conf", nullptr},
      {"master_addr", nullptr},
      {"master_port", nullptr},
      {"node_rank", nullptr},
      {"start_method", nullptr},
  };
  return *flags;
}


// How the program is started, from the launcher's own flags.
struct ProgramStyle {
  bool no_python = false;  // --no_python: run it as it is
  bool module = false;     // -m: python -m PROGRAM
  // --nproc_per_node's value, resolved once --device is known too.
  std::string nproc_per_node = "1";
};

// Reads the launcher's flags at the front of `args` into `options` and
// `style`; returns the index of the program (args.size() when none).
absl::StatusOr<size_t> ParseFlags(const std::vector<std::string>& args,
                                  LaunchOptions* options, ProgramStyle* style) {
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") return i + 1;
    if (arg == "-m" || arg == "--module") {
      style->module = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) break;  // the program
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    name = absl::StrReplaceAll(name, {{"-", "_"}});
    if (name == "no_python") {
      style->no_python = true;
      continue;
    }
    if (name == "self_managed") {
      options->self_managed = true;
      continue;
    }
    if (name == "standalone") {
      return Bad(name, "gradsync always rendezvouses through a coordinator: "
                       "start gradsync-coordinator and pass --coordinator");
    }
    auto flag = ValueFlags().find(name);
    if (flag == ValueFlags().end() && name != "nproc_per_node") {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradsync launch: unknown flag '", arg, "'\n", kLaunchUsage));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return Bad(name, "needs a value");
      value = args[++i];
    }
    if (name == "nproc_per_node") {
      style->nproc_per_node = value;
    } else if (flag->second) {
      GS_RETURN_IF_ERROR(flag->second(options, value));
    }
  }
  return i;
}

}  // namespace

StdStreams StdStreamsSetting::For(int local_rank) const {
  if (by_local_rank.empty()) return all;
  auto found = by_local_rank.find(local_rank);
  return found == by_local_rank.end() ? StdStreams::kNone : found->second;
}

absl::StatusOr<LaunchOptions> ParseLaunchArgs(
    const std::vector<std::string>& args) {
  LaunchOptions options;
  ProgramStyle style;
  GS_ASSIGN_OR_RETURN(const size_t i, ParseFlags(args, &options, &style));
  GS_ASSIGN_OR_RETURN(options.nproc_per_node,
                      ParseNproc(style.nproc_per_node, options.device));
  if (options.coordinator.empty()) {
    return Bad("coordinator", "required: the coordinator's HOST:PORT");
  }
  if (options.job.empty()) return Bad("job", "required: the job's id");
  if (i >= args.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradsync launch: no program to run\n", kLaunchUsage));
  }
  const std::string& program = args[i];
  if (style.module || (!style.no_python && absl::EndsWith(program, ".py"))) {
    options.command = {options.python, "-u"};
    if (style.module) options.command.push_back("-m");
  }
  options.command.insert(options.command.end(), args.begin() + i, args.end());
  const size_t slash = program.rfind('/');
  if (program.substr(slash == std::string::npos ? 0 : slash + 1) ==
      "gradsync-worker") {
    options.self_managed = true;
  }
  return options;
}

}  // namespace gradsync
