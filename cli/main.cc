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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "cli/job_format.h"
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

constexpr char kUsage[] =
    "gradsync: inspect a gradsync coordinator.\n"
    "Usage:\n"
    "  gradsync --coordinator=HOST:PORT jobs [--json]\n"
    "  gradsync --coordinator=HOST:PORT status JOB [--json]\n"
    "      [--ranks=FIRST-LAST | --unhealthy | --all]\n"
    "    (a summary, then the members: all of them up to 64 ranks, else the\n"
    "    unhealthy ones; the flags choose)\n"
    "  gradsync --coordinator=HOST:PORT watch JOB [--json] [--interval=1s]\n"
    "      [--ranks=FIRST-LAST | --unhealthy | --all]\n"
    "    (a live view, refreshed until the job ends; --json prints\n"
    "    one JSON document per line per update)\n"
    "  gradsync --coordinator=HOST:PORT create JOB --nnodes=N[:M]\n"
    "      [--nproc_per_node=P] [--json]\n"
    "    (with the admin's token; prints the job's token for its workers)\n"
    "  gradsync --coordinator=HOST:PORT token rotate JOB\n"
    "    (with the admin's token: prints a new token for the job; its old\n"
    "    token authenticates no new call)\n"
    "  gradsync --coordinator=HOST:PORT token revoke JOB\n"
    "    (with the admin's token: the job keeps no token; only the admin\n"
    "    acts in it until a rotate)\n"
    "  gradsync launch --coordinator=HOST:PORT --job=ID [FLAGS] PROGRAM ...\n"
    "    (start this node's processes of a job; gradsync launch --help)";

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "gradsync: %s\n", message.c_str());
  return code;
}

// Jobs of more ranks than this list only their unhealthy members by
// default: the summary says the rest.
constexpr int kListAllUpTo = 64;
// Members one `status` prints at most (unless --all or --ranks).
constexpr int kListedMembers = 50;

// The members `status` and `watch` ask for by flag: --ranks and
// --unhealthy.
absl::StatusOr<gradsync::v1::MemberQuery> MemberQueryFromFlags() {
  gradsync::v1::MemberQuery query;
  const std::string ranks = absl::GetFlag(FLAGS_ranks);
  if (!ranks.empty()) {
    std::pair<std::string, std::string> bounds = absl::StrSplit(ranks, '-');
    int first = 0, last = 0;
    if (!absl::SimpleAtoi(bounds.first, &first) ||
        !absl::SimpleAtoi(bounds.second, &last) || first < 0 || last < first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ranks: '", ranks, "' is not FIRST-LAST (e.g. 0-63)"));
    }
    query.set_rank_from(first);
    query.set_rank_to(last + 1);
  }
  query.set_unhealthy_only(absl::GetFlag(FLAGS_unhealthy));
  return query;
}

// `query` (from the flags) for job `job_id`: when no flag chose, a job of
// more than kListAllUpTo ranks lists only its unhealthy members. Asks the
// coordinator for the job's summary, which is cheap, to know its size.
absl::StatusOr<gradsync::v1::MemberQuery> MembersToShow(
    gradsync::CoordinatorClient* client, const std::string& job_id,
    gradsync::v1::MemberQuery query) {
  if (absl::GetFlag(FLAGS_all) || !absl::GetFlag(FLAGS_ranks).empty() ||
      query.unhealthy_only()) {
    return query;
  }
  gradsync::v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.mutable_members()->set_none(true);
  absl::StatusOr<gradsync::v1::GetJobResponse> summary =
      client->QueryJob(request);
  if (!summary.ok()) return summary.status();
  query.set_unhealthy_only(summary->job().world_size() > kListAllUpTo);
  return query;
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

// gradsync create JOB
int CreateJob(gradsync::CoordinatorClient* client, const std::string& job_id,
              bool json) {
  auto range = gradsync::ParseNodeRange(absl::GetFlag(FLAGS_nnodes));
  if (!range.ok()) return Fail(std::string(range.status().message()), 2);
  gradsync::v1::JobConfig config;
  config.set_job_id(job_id);
  config.set_min_nodes(range->first);
  config.set_max_nodes(range->second);
  config.set_nproc_per_node(absl::GetFlag(FLAGS_nproc_per_node));
  auto created = client->CreateJob(config);
  if (!created.ok()) return Fail(std::string(created.status().message()), 1);
  std::cout << (json ? gradsync::CreatedJobToJson(*created)
                     : gradsync::FormatCreatedJob(*created));
  return 0;
}

// gradsync token rotate|revoke JOB
int Token(gradsync::CoordinatorClient* client, const std::string& what,
          const std::string& job_id) {
  if (what == "rotate") {
    auto rotated = client->RotateToken(job_id);
    if (!rotated.ok()) return Fail(std::string(rotated.status().message()), 1);
    std::cout << *rotated << "\n";
    return 0;
  }
  absl::Status revoked = client->RevokeToken(job_id);
  if (!revoked.ok()) return Fail(std::string(revoked.message()), 1);
  std::cout << "job '" << job_id << "': token revoked\n";
  return 0;
}

// gradsync status JOB
int Status(gradsync::CoordinatorClient* client, const std::string& job_id,
           const gradsync::v1::MemberQuery& flags_query, bool json) {
  auto query = MembersToShow(client, job_id, flags_query);
  if (!query.ok()) return Fail(std::string(query.status().message()), 1);
  gradsync::v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_with_buckets(json);
  *request.mutable_members() = *query;
  const bool paged = !json && !absl::GetFlag(FLAGS_all) &&
                     absl::GetFlag(FLAGS_ranks).empty();
  if (paged) request.mutable_members()->set_page_size(kListedMembers);
  auto job = client->QueryJob(request);
  if (!job.ok()) return Fail(std::string(job.status().message()), 1);
  std::cout << (json ? gradsync::JobStatusToJson(job->job())
                     : gradsync::FormatJobStatus(job->job(), absl::Now()));
  return 0;
}

// gradsync watch JOB: until the job ends.
int Watch(gradsync::CoordinatorClient* client, const std::string& job_id,
          const gradsync::v1::MemberQuery& flags_query, bool json) {
  auto query = MembersToShow(client, job_id, flags_query);
  if (!query.ok()) return Fail(std::string(query.status().message()), 1);
  // On a terminal, each update replaces the previous one.
  const bool redraw = !json && isatty(STDOUT_FILENO);
  absl::Status watched = client->WatchJob(
      job_id, absl::GetFlag(FLAGS_interval), /*with_buckets=*/json,
      [&](const gradsync::v1::JobStatus& job) {
        if (json) {
          std::cout << gradsync::JobStatusToJsonLine(job) << std::flush;
          return true;
        }
        const absl::Time now = absl::Now();
        std::cout << (redraw ? "\033[H\033[2J" : "\n")
                  << "gradsync watch " << job_id << "  "
                  << absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone())
                  << "\n\n"
                  << gradsync::FormatJobStatus(job, now) << std::flush;
        return true;
      },
      *query);
  if (!watched.ok()) return Fail(std::string(watched.message()), 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "launch") {
    return gradsync::RunLaunchCommand(
        std::vector<std::string>(argv + 2, argv + argc));
  }
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) return Fail(std::string("no command\n") + kUsage, 2);
  const std::string command = args[1];
  auto client = ClientFromFlags();
  if (!client.ok()) return Fail(std::string(client.status().message()), 2);
  const bool json = absl::GetFlag(FLAGS_json);

  if (command == "jobs" && args.size() == 2) {
    auto jobs = (*client)->ListJobs();
    if (!jobs.ok()) return Fail(std::string(jobs.status().message()), 1);
    std::cout << (json ? gradsync::JobsToJson(*jobs)
                       : gradsync::FormatJobsTable(*jobs, absl::Now()));
    return 0;
  }
  if (command == "create" && args.size() == 3) {
    return CreateJob(client->get(), args[2], json);
  }
  if (command == "token" && args.size() == 4 &&
      (args[2] == std::string("rotate") || args[2] == std::string("revoke"))) {
    return Token(client->get(), args[2], args[3]);
  }
  absl::StatusOr<gradsync::v1::MemberQuery> flags_query =
      MemberQueryFromFlags();
  if (!flags_query.ok()) {
    return Fail(std::string(flags_query.status().message()), 2);
  }
  if (command == "status" && args.size() == 3) {
    return Status(client->get(), args[2], *flags_query, json);
  }
  if (command == "watch" && args.size() == 3) {
    return Watch(client->get(), args[2], *flags_query, json);
  }
  return Fail("unknown command or wrong arguments\n" + std::string(kUsage), 2);
}
