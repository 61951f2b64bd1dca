// gradsync-coordinator: the gradsync coordinator service.
//
//   gradsync-coordinator --listen=0.0.0.0:29400
//
// Stops gracefully on SIGINT or SIGTERM: in-flight calls get
// --shutdown_grace, then are cancelled. Shutdown is bounded: a second signal,
// or a shutdown still unfinished kShutdownMargin after the grace period, ends
// the process at once (exit code 2, with an error that says which).
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/authenticator.h"
#include "server/coordinator.h"
#include "server/memory_available.h"
#include "server/server_credentials.h"
#include "server/standby_server.h"
#include "server/storage/open_storage.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:29400",
          "HOST:PORT to serve gRPC on (port 0 picks a free port)");
ABSL_FLAG(absl::Duration, poll_interval, absl::Milliseconds(10),
          "resolution of timeouts (last call, join, key waits)");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "how long in-flight calls may finish on shutdown");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on over HTTP (GET /metrics; "
          "port 0 picks a free port); empty: no metrics endpoint");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, write the bound metrics port to this file once serving");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "how often workers send heartbeats (jobs may set their own)");
ABSL_FLAG(int, missed_heartbeats, 3,
          "a member that misses this many heartbeat intervals is LOST (jobs "
          "may set their own)");
ABSL_FLAG(std::optional<absl::Duration>, reconnect_grace, std::nullopt,
          "how long a member whose heartbeat stream broke (a killed process, "
          "or a connection reset or proxy restart) may take to heartbeat "
          "again on a new stream before it is LOST; unset: the job's "
          "missed-heartbeat window (interval x missed heartbeats); 0: LOST at "
          "once");
ABSL_FLAG(absl::Duration, straggler_threshold, absl::Milliseconds(100),
          "a rank whose first gradient bucket is consistently later than the "
          "earliest rank's by more than this is flagged as a straggler");
ABSL_FLAG(absl::Duration, hang_timeout, absl::Seconds(30),
          "how long collectives may stop advancing, with ranks disagreeing, "
          "before status reports a hang, for a job whose round has not "
          "reported 8 steps yet; after that it follows the job's step times "
          "(see --hang_timeout_factor) unless the job set its own");
ABSL_FLAG(double, hang_timeout_factor, 10,
          "the self-set hang timeout: this many times the 99th percentile of "
          "the round's recent step times, within --min_hang_timeout and "
          "--max_hang_timeout; 0: always --hang_timeout");
ABSL_FLAG(absl::Duration, min_hang_timeout, absl::Seconds(1),
          "the shortest self-set hang timeout (any hang timeout is also at "
          "least two of the job's heartbeat intervals)");
ABSL_FLAG(absl::Duration, max_hang_timeout, absl::Minutes(10),
          "the longest self-set hang timeout");
ABSL_FLAG(bool, shed_heartbeats, true,
          "past its heartbeat capacity, ask workers for longer heartbeat "
          "intervals (up to --max_heartbeat_slowdown times their jobs') and "
          "find members LOST by them, instead of declaring live members LOST");
ABSL_FLAG(int, max_heartbeat_slowdown, 16,
          "the most times a job's heartbeat interval the coordinator asks for "
          "while it sheds heartbeat load (>= 1)");
ABSL_FLAG(bool, police_heartbeats, true,
          "read a heartbeat stream no faster than twice the rate the "
          "coordinator asked of its members, after a burst of 8 heartbeats "
          "each (the rest waits in the connection), so that workers "
          "ignoring their interval cannot keep the coordinator behind and "
          "slow failure detection in other jobs");
ABSL_FLAG(bool, grow_receive_windows, true,
          "let gRPC grow each stream's receive window with the bandwidth-"
          "delay product it measures (4-11 MiB a held stream measured); false "
          "keeps 64 KiB, so a heartbeat stream held back for sending faster "
          "than asked buffers about 0.2 MiB instead of 4.3 MiB (for a "
          "coordinator exposed to clients it does not trust), while "
          "messages larger than that take about one round trip more");
ABSL_FLAG(std::string, transport_memory_limit, "0",
          "bytes gRPC may hold for all the coordinator's connections "
          "together (read buffers, calls, messages received and not yet "
          "read), or a share of the memory this process may use (25%: of "
          "its cgroup's limit, else the machine's): near it gRPC shrinks "
          "receive windows so that senders wait, and past it ends streams "
          "and idle connections rather than the coordinator running out of "
          "memory (obedient clients' calls too); 0: no limit");
ABSL_FLAG(double, max_heartbeat_rate, 0,
          "handle at most this many heartbeats per second, shared fairly "
          "across jobs (a job sending less than its share is handled at "
          "once), the rest waiting in the connections as on a saturated "
          "machine (tests and benchmarks reach the capacity cheaply with "
          "it); 0: no cap");
ABSL_FLAG(int, completion_queues, 32,
          "completion queues (each with a thread) serving heartbeat streams "
          "and joins; more keep them fast with many workers");
ABSL_FLAG(int, max_streams_per_connection, 1024,
          "heartbeat streams and job watches one client connection may hold "
          "at once (a node agent holds one for its node); 0: no limit");
ABSL_FLAG(absl::Duration, retention, absl::Hours(1),
          "how long jobs that succeeded or failed stay queryable");
ABSL_FLAG(std::string, state_dir, "",
          "directory for durable state (a SQLite database, locked by this "
          "coordinator): jobs, their results and key-value entries survive a "
          "restart; empty: in memory only");
ABSL_FLAG(bool, check_state, false,
          "verify --state_dir (format and SQLite's integrity check) or the "
          "--etcd namespace (format), print a summary and exit: 0 when "
          "sound, 1 otherwise; writes nothing, safe while a coordinator "
          "serves from it");
ABSL_FLAG(std::string, etcd, "",
          "HOST:PORT[,HOST:PORT...] of an etcd v3 cluster to keep the durable "
          "state in, instead of --state_dir (names in a list are resolved "
          "to their IPv4 addresses once, at start); empty: no etcd");
ABSL_FLAG(std::string, etcd_prefix, "/gradsync/",
          "namespace of this coordinator's keys in etcd; the coordinators "
          "started with the same --etcd and prefix are replicas: one leads "
          "and serves, the others stand by (answering every call with the "
          "leader's address) and take over when it stops");
ABSL_FLAG(int64_t, etcd_max_request_bytes, 1536 * 1024,
          "with --etcd: the largest request the etcd cluster accepts (its "
          "--max-request-bytes; etcd does not report it): writes are split "
          "under it, and a single value above it is refused naming it");
ABSL_FLAG(absl::Duration, etcd_lease_ttl, absl::Seconds(2),
          "with --etcd: the TTL of the leader's lease (whole seconds, 2s to "
          "8s). A leader that stops is replaced after at most this; a "
          "leader whose renewals stall (an etcd leader lost: its election "
          "takes about etcd's --election-timeout, 1s by default) gives up "
          "its leadership when 3/4 of it passed without one, and a standby "
          "takes over. 5s rides through an etcd election");
ABSL_FLAG(std::string, advertise, "",
          "with --etcd: the address this coordinator publishes when it leads "
          "(default: --listen)");
ABSL_FLAG(std::string, etcd_tls_ca, "",
          "with --etcd: PEM CA that signed etcd's certificate: talk to etcd "
          "over TLS (empty: plaintext)");
ABSL_FLAG(std::string, etcd_tls_cert, "",
          "with --etcd_tls_ca: this coordinator's PEM client certificate, for "
          "an etcd with --client-cert-auth");
ABSL_FLAG(std::string, etcd_tls_key, "", "the PEM private key of --etcd_tls_cert");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain to serve gRPC over TLS with, and the "
          "--metrics_listen port over HTTPS (empty: plaintext)");
ABSL_FLAG(std::string, tls_key, "", "the PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "with --tls_cert: require every client to present a certificate "
          "signed by this PEM CA (mutual TLS)");
ABSL_FLAG(std::string, auth, "none",
          "none: any client may do anything; token: every call carries a "
          "token (authorization: Bearer ...): the admin's (--admin_token_file) "
          "may do anything, a job's (issued by `gradsync create`) only acts "
          "in its job");
ABSL_FLAG(std::string, admin_token_file, "",
          "with --auth=token: a file holding the admin's token");
ABSL_FLAG(std::string, create_jobs_on_join, "auto",
          "whether a worker's first join may create its job: true, false, "
          "or auto (false with --auth=token: the admin creates jobs with "
          "`gradsync create`)");
ABSL_FLAG(int64_t, max_jobs, 10000,
          "jobs the coordinator holds, ended ones included until forgotten "
          "(--retention); creating one more is RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_world_size, 1000000,
          "processes a job may have (max nodes x nproc_per_node)");
ABSL_FLAG(int64_t, max_kv_key_bytes, 1024,
          "the longest key a job's key-value store takes (1 to 65536)");
ABSL_FLAG(int64_t, max_kv_value_bytes, 1 << 20,
          "the largest value a job's key-value store takes (1 to 7 MiB: a "
          "request carries it under the coordinator's 8 MiB message limit; "
          "with --etcd, a key and value of the largest sizes must fit "
          "--etcd_max_request_bytes less 4 KiB, or the coordinator does not "
          "start)");
ABSL_FLAG(int64_t, max_kv_keys_per_job, 1000000,
          "keys in a job's key-value store");
ABSL_FLAG(int64_t, max_kv_bytes_per_job, int64_t{1} << 30,
          "bytes (keys and values) in a job's key-value store");
ABSL_FLAG(std::string, port_file, "",
          "if set, write the bound port to this file once serving (for "
          "scripts that start the coordinator on port 0)");

namespace {

// How long past --shutdown_grace a shutdown may take before the process
// exits without finishing it.
constexpr absl::Duration kShutdownMargin = absl::Seconds(3);

// Ends the process if `coordinator.Shutdown()` outlasts `bound` or a second
// stop signal arrives. Runs on its own thread; the signals are blocked.
void BoundShutdown(const sigset_t& stop_signals, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  for (;;) {
    const timespec left = absl::ToTimespec(
        std::max(deadline - absl::Now(), absl::ZeroDuration()));
    const int signal_number = sigtimedwait(&stop_signals, nullptr, &left);
    if (signal_number > 0) {
      GS_LOG(ERROR) << "received " << strsignal(signal_number)
                    << " again: exiting without finishing the shutdown";
      std::_Exit(2);
    }
    if (errno == EAGAIN || absl::Now() >= deadline) break;  // EINTR: again
  }
  GS_LOG(ERROR) << "shutdown did not finish within "
                << absl::FormatDuration(bound)
                << " (--shutdown_grace plus " << absl::FormatDuration(kShutdownMargin)
                << "): exiting without it";
  std::_Exit(2);
}

// --check_state: verifies the state `spec` names and prints what it holds.
int RunCheckState(const gradsync::StorageSpec& spec) {
  const std::string where =
      spec.etcd.empty() ? spec.state_dir
                        : absl::StrCat("etcd at ", spec.etcd, " under '",
                                       spec.etcd_prefix, "'");
  absl::StatusOr<gradsync::StateSummary> summary = gradsync::CheckState(spec);
  if (!summary.ok()) {
    std::fprintf(stderr, "%s: %s\n", where.c_str(),
                 summary.status().ToString().c_str());
    return EXIT_FAILURE;
  }
  std::printf("%s: ok (state format %d, %lld entries: %lld jobs, %lld "
              "key-value entries)\n",
              where.c_str(), summary->format,
              static_cast<long long>(summary->entries),
              static_cast<long long>(summary->jobs),
              static_cast<long long>(summary->kv_keys));
  return EXIT_SUCCESS;
}

// Writes `port` and a newline to `path` (nothing when `path` is empty).
bool WritePortFile(const std::string& path, int port) {
  if (path.empty()) return true;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || std::fprintf(f, "%d\n", port) < 0 ||
      std::fclose(f) != 0) {
    GS_LOG(ERROR) << "cannot write the port to " << path;
    return false;
  }
  return true;
}

// Ends the process on a stop signal while `*campaigning` holds: a standby
// holds nothing to shut down. Runs on its own thread; the signals are
// blocked.
void ExitOnStopWhile(const sigset_t& stop_signals,
                     const std::atomic<bool>* campaigning) {
  const timespec tick = absl::ToTimespec(absl::Milliseconds(100));
  while (campaigning->load()) {
    const int signal_number = sigtimedwait(&stop_signals, nullptr, &tick);
    if (signal_number > 0) {
      GS_LOG(INFO) << "received " << strsignal(signal_number)
                   << " while standing by: exiting";
      std::_Exit(EXIT_SUCCESS);
    }
  }
}

// The leadership of an --etcd namespace ended while this coordinator served:
// another may lead already, and every write of this one is refused.
void LeadershipLost(const absl::Status& why) {
  GS_LOG(ERROR) << "lost the leadership: " << why.message()
                << "; exiting (start this coordinator again to stand by)";
  std::_Exit(EXIT_FAILURE);
}

// The coordinator's settings from its flags, checked; INVALID_ARGUMENT
// naming the flags otherwise.
absl::Status CheckConfig(const gradsync::CoordinatorConfig& config) {
  if (config.health.min_hang_timeout <= absl::ZeroDuration() ||
      config.health.max_hang_timeout < config.health.min_hang_timeout ||
      config.health.hang_timeout_factor < 0) {
    return absl::InvalidArgumentError(
        "--min_hang_timeout must be > 0, --max_hang_timeout >= "
        "--min_hang_timeout and --hang_timeout_factor >= 0");
  }
  if (config.health.heartbeat_interval <= absl::ZeroDuration() ||
      config.health.missed_heartbeats < 1 || config.retention < absl::ZeroDuration() ||
      config.shutdown_grace < absl::ZeroDuration() ||
      config.max_streams_per_connection < 0 ||
      config.health.shedding.max_factor < 1 || config.max_heartbeat_rate < 0 ||
      config.health.reconnect_grace.value_or(absl::ZeroDuration()) <
          absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--heartbeat_interval must be > 0, --missed_heartbeats >= 1, "
        "--retention >= 0, --shutdown_grace >= 0, --reconnect_grace >= 0, "
        "--max_streams_per_connection >= 0, --max_heartbeat_slowdown >= 1 and "
        "--max_heartbeat_rate >= 0");
  }
  if (config.job_limits.max_jobs < 1 || config.job_limits.max_world_size < 1 ||
      config.kv_limits.max_keys_per_round < 1 ||
      config.kv_limits.max_bytes_per_round < 1) {
    return absl::InvalidArgumentError(
        "--max_jobs, --max_world_size, --max_kv_keys_per_job and "
        "--max_kv_bytes_per_job must be >= 1");
  }
  if (config.kv_limits.max_key_bytes < 1 ||
      config.kv_limits.max_key_bytes > 65536 ||
      config.kv_limits.max_value_bytes < 1 ||
      config.kv_limits.max_value_bytes > (7 << 20)) {
    return absl::InvalidArgumentError(
        "--max_kv_key_bytes must be in [1, 65536] and --max_kv_value_bytes in "
        "[1, 7340032] (7 MiB)");
  }
  return absl::OkStatus();
}

// Heartbeats, failure detection and diagnosis.
gradsync::HealthConfig HealthConfigFromFlags() {
  gradsync::HealthConfig health;
  health.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  health.missed_heartbeats = absl::GetFlag(FLAGS_missed_heartbeats);
  health.straggler_threshold = absl::GetFlag(FLAGS_straggler_threshold);
  health.hang_timeout = absl::GetFlag(FLAGS_hang_timeout);
  health.hang_timeout_factor = absl::GetFlag(FLAGS_hang_timeout_factor);
  health.min_hang_timeout = absl::GetFlag(FLAGS_min_hang_timeout);
  health.max_hang_timeout = absl::GetFlag(FLAGS_max_hang_timeout);
  health.reconnect_grace = absl::GetFlag(FLAGS_reconnect_grace);
  health.shedding.enabled = absl::GetFlag(FLAGS_shed_heartbeats);
  health.shedding.max_factor = absl::GetFlag(FLAGS_max_heartbeat_slowdown);
  return health;
}

// --transport_memory_limit in bytes (0: none), logged when set.
absl::StatusOr<int64_t> TransportMemoryLimit() {
  absl::StatusOr<gradsync::MemoryLimit> limit =
      gradsync::ParseMemoryLimit(absl::GetFlag(FLAGS_transport_memory_limit));
  if (!limit.ok()) {
    return absl::Status(limit.status().code(),
                        absl::StrCat("--transport_memory_limit: ",
                                     limit.status().message()));
  }
  if (limit->bytes > 0) {
    GS_LOG(INFO) << "transport memory limit: " << limit->description;
  }
  return limit->bytes;
}

// Everything but the storage, from the flags.
absl::StatusOr<gradsync::CoordinatorConfig> ConfigFromFlags() {
  gradsync::CoordinatorConfig config;
  config.listen_address = absl::GetFlag(FLAGS_listen);
  config.poll_interval = absl::GetFlag(FLAGS_poll_interval);
  config.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  config.metrics_listen_address = absl::GetFlag(FLAGS_metrics_listen);
  config.health = HealthConfigFromFlags();
  config.max_heartbeat_rate = absl::GetFlag(FLAGS_max_heartbeat_rate);
  config.police_heartbeats = absl::GetFlag(FLAGS_police_heartbeats);
  config.grow_receive_windows = absl::GetFlag(FLAGS_grow_receive_windows);
  GS_ASSIGN_OR_RETURN(config.transport_memory_limit, TransportMemoryLimit());
  config.job_limits.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  config.job_limits.max_world_size = absl::GetFlag(FLAGS_max_world_size);
  config.kv_limits.max_key_bytes = absl::GetFlag(FLAGS_max_kv_key_bytes);
  config.kv_limits.max_value_bytes = absl::GetFlag(FLAGS_max_kv_value_bytes);
  config.kv_limits.max_keys_per_round = absl::GetFlag(FLAGS_max_kv_keys_per_job);
  config.kv_limits.max_bytes_per_round =
      absl::GetFlag(FLAGS_max_kv_bytes_per_job);
  config.retention = absl::GetFlag(FLAGS_retention);
  config.completion_queues = absl::GetFlag(FLAGS_completion_queues);
  config.max_streams_per_connection =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  GS_RETURN_IF_ERROR(CheckConfig(config));
  GS_ASSIGN_OR_RETURN(config.admin_token,
                      gradsync::AdminToken(absl::GetFlag(FLAGS_auth),
                                           absl::GetFlag(FLAGS_admin_token_file)));
  const std::string create_on_join = absl::GetFlag(FLAGS_create_jobs_on_join);
  if (create_on_join != "auto" && create_on_join != "true" &&
      create_on_join != "false") {
    return absl::InvalidArgumentError(
        "--create_jobs_on_join must be auto, true or false");
  }
  config.job_limits.create_on_join =
      create_on_join == "auto" ? config.admin_token.empty()
                               : create_on_join == "true";
  GS_ASSIGN_OR_RETURN(
      config.credentials,
      gradsync::MakeServerCredentials({absl::GetFlag(FLAGS_tls_cert),
                                       absl::GetFlag(FLAGS_tls_key),
                                       absl::GetFlag(FLAGS_tls_client_ca)}));
  config.http_tls_cert = absl::GetFlag(FLAGS_tls_cert);
  config.http_tls_key = absl::GetFlag(FLAGS_tls_key);
  return config;
}

gradsync::StorageSpec StorageSpecFromFlags() {
  gradsync::StorageSpec spec;
  spec.state_dir = absl::GetFlag(FLAGS_state_dir);
  spec.etcd = absl::GetFlag(FLAGS_etcd);
  spec.etcd_prefix = absl::GetFlag(FLAGS_etcd_prefix);
  spec.etcd_max_request_bytes = absl::GetFlag(FLAGS_etcd_max_request_bytes);
  spec.largest_client_write_bytes = absl::GetFlag(FLAGS_max_kv_key_bytes) +
                                    absl::GetFlag(FLAGS_max_kv_value_bytes);
  spec.etcd_tls = {absl::GetFlag(FLAGS_etcd_tls_ca),
                   absl::GetFlag(FLAGS_etcd_tls_cert),
                   absl::GetFlag(FLAGS_etcd_tls_key)};
  return spec;
}

// Opens the storage as the leader. With etcd, campaigning can take long:
// meanwhile the address answers as a standby (telling callers the leader),
// and a stop signal ends the process.
// Sets *leader_term once it leads under etcd.
absl::StatusOr<std::unique_ptr<gradsync::Storage>> OpenStorageAsLeader(
    gradsync::StorageSpec spec, const gradsync::CoordinatorConfig& config,
    const sigset_t& stop_signals, int64_t* leader_term) {
  spec.lead = true;
  spec.lease_ttl = absl::GetFlag(FLAGS_etcd_lease_ttl);
  spec.advertise = absl::GetFlag(FLAGS_advertise);
  if (spec.advertise.empty()) spec.advertise = config.listen_address;
  spec.on_lost = LeadershipLost;
  spec.on_leading = [leader_term](int64_t term) { *leader_term = term; };
  std::unique_ptr<gradsync::StandbyServer> standby;
  if (!spec.etcd.empty()) {
    GS_ASSIGN_OR_RETURN(standby,
                        gradsync::StandbyServer::Start(config.listen_address,
                                                       config.credentials));
    spec.on_standing_by = [&standby](const std::string& leader) {
      standby->SetLeader(leader);
    };
  }
  std::atomic<bool> campaigning{true};
  std::thread standby_watch(ExitOnStopWhile, stop_signals, &campaigning);
  absl::StatusOr<std::unique_ptr<gradsync::Storage>> storage =
      gradsync::OpenStorage(spec);
  campaigning.store(false);
  standby_watch.join();
  standby.reset();  // frees the address for the coordinator
  return storage;
}

// Serves until SIGINT or SIGTERM, then shuts down within the grace.
int Serve(gradsync::CoordinatorConfig config, const sigset_t& stop_signals) {
  gradsync::Coordinator coordinator(config);
  absl::Status started = coordinator.Start();
  if (!started.ok()) {
    GS_LOG(ERROR) << "cannot start: " << started;
    return EXIT_FAILURE;
  }
  if (!WritePortFile(absl::GetFlag(FLAGS_metrics_port_file),
                     coordinator.metrics_port()) ||
      !WritePortFile(absl::GetFlag(FLAGS_port_file), coordinator.port())) {
    return EXIT_FAILURE;
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  GS_LOG(INFO) << "received " << strsignal(signal_number);
  std::thread(BoundShutdown, stop_signals, config.shutdown_grace + kShutdownMargin)
      .detach();
  coordinator.Shutdown();
  return EXIT_SUCCESS;
}

}  // namespace

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
#ifdef __GLIBC__
  // Requests of up to the 8 MiB message limit come and go. glibc raises its
  // mmap threshold to the largest block freed, after which such buffers stay
  // in the heap's arenas when freed: a burst of large requests left the
  // coordinator with ~370 MiB more resident memory for good
  // (tests/integration/hostile_client_test). A fixed threshold gives blocks
  // of 1 MiB and more back to the system when they are freed.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif

  // Block the stop signals in every thread; a dedicated thread waits for
  // them, so no work happens in a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<gradsync::CoordinatorConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    GS_LOG(ERROR) << config.status().message();
    return EXIT_FAILURE;
  }
  const gradsync::StorageSpec spec = StorageSpecFromFlags();
  if (absl::GetFlag(FLAGS_check_state)) return RunCheckState(spec);
  absl::StatusOr<std::unique_ptr<gradsync::Storage>> storage =
      OpenStorageAsLeader(spec, *config, stop_signals, &config->leader_term);
  if (!storage.ok()) {
    GS_LOG(ERROR) << storage.status().message();
    return EXIT_FAILURE;
  }
  config->storage = storage->get();
  return Serve(*std::move(config), stop_signals);
}
