#include "cli/commands.h"

#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/job_format.h"
#include "common/job_config.h"

namespace gradsync {

const char kCommandUsage[] =
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

namespace {

// Jobs of more ranks than this list only their unhealthy members by
// default: the summary says the rest.
constexpr int kListAllUpTo = 64;
// Members one `status` prints at most (unless --all or --ranks).
constexpr int kListedMembers = 50;

// One command's run: its options, client and streams.
class Command {
 public:
  Command(const CommandOptions& options, CoordinatorClient* client,
          std::ostream& out, std::ostream& err)
      : options_(options), client_(client), out_(out), err_(err) {}

  int Jobs();
  int Create(const std::string& job_id);
  int Token(const std::string& what, const std::string& job_id);
  int Status(const std::string& job_id);
  int Watch(const std::string& job_id);

  int Fail(absl::string_view message, int code) {
    err_ << "gradsync: " << message << "\n";
    return code;
  }

 private:
  // The members `status` and `watch` show: --ranks and --unhealthy; when no
  // flag chose, a job of more than kListAllUpTo ranks lists only its
  // unhealthy members (the job's summary, which is cheap, tells its size).
  absl::StatusOr<v1::MemberQuery> MembersToShow(const std::string& job_id);

  const CommandOptions& options_;
  CoordinatorClient* const client_;
  std::ostream& out_;
  std::ostream& err_;
};

// --ranks=FIRST-LAST and --unhealthy as a query.
absl::StatusOr<v1::MemberQuery> QueryFromOptions(const CommandOptions& options) {
  v1::MemberQuery query;
  if (!options.ranks.empty()) {
    std::pair<std::string, std::string> bounds =
        absl::StrSplit(options.ranks, '-');
    int first = 0, last = 0;
    if (!absl::SimpleAtoi(bounds.first, &first) ||
        !absl::SimpleAtoi(bounds.second, &last) || first < 0 || last < first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ranks: '", options.ranks, "' is not FIRST-LAST (e.g. 0-63)"));
    }
    query.set_rank_from(first);
    query.set_rank_to(last + 1);
  }
  query.set_unhealthy_only(options.unhealthy);
  return query;
}

absl::StatusOr<v1::MemberQuery> Command::MembersToShow(
    const std::string& job_id) {
  absl::StatusOr<v1::MemberQuery> query = QueryFromOptions(options_);
  if (!query.ok() || options_.all || !options_.ranks.empty() ||
      query->unhealthy_only()) {
    return query;
  }
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.mutable_members()->set_none(true);
  absl::StatusOr<v1::GetJobResponse> summary = client_->QueryJob(request);
  if (!summary.ok()) return summary.status();
  query->set_unhealthy_only(summary->job().world_size() > kListAllUpTo);
  return query;
}

int Command::Jobs() {
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client_->ListJobs();
  if (!jobs.ok()) return Fail(jobs.status().message(), 1);
  out_ << (options_.json ? JobsToJson(*jobs)
                         : FormatJobsTable(*jobs, absl::Now()));
  return 0;
}

int Command::Create(const std::string& job_id) {
  absl::StatusOr<std::pair<int, int>> range = ParseNodeRange(options_.nnodes);
  if (!range.ok()) return Fail(range.status().message(), 2);
  v1::JobConfig config;
  config.set_job_id(job_id);
  config.set_min_nodes(range->first);
  config.set_max_nodes(range->second);
  config.set_nproc_per_node(options_.nproc_per_node);
  absl::StatusOr<v1::CreateJobResponse> created = client_->CreateJob(config);
  if (!created.ok()) return Fail(created.status().message(), 1);
  out_ << (options_.json ? CreatedJobToJson(*created)
                         : FormatCreatedJob(*created));
  return 0;
}

int Command::Token(const std::string& what, const std::string& job_id) {
  if (what == "rotate") {
    absl::StatusOr<std::string> rotated = client_->RotateToken(job_id);
    if (!rotated.ok()) return Fail(rotated.status().message(), 1);
    out_ << *rotated << "\n";
    return 0;
  }
  absl::Status revoked = client_->RevokeToken(job_id);
  if (!revoked.ok()) return Fail(revoked.message(), 1);
  out_ << "job '" << job_id << "': token revoked\n";
  return 0;
}

int Command::Status(const std::string& job_id) {
  absl::StatusOr<v1::MemberQuery> query = MembersToShow(job_id);
  if (absl::IsInvalidArgument(query.status())) {
    return Fail(query.status().message(), 2);
  }
  if (!query.ok()) return Fail(query.status().message(), 1);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_with_buckets(options_.json);
  *request.mutable_members() = *query;
  if (!options_.json && !options_.all && options_.ranks.empty()) {
    request.mutable_members()->set_page_size(kListedMembers);
  }
  absl::StatusOr<v1::GetJobResponse> job = client_->QueryJob(request);
  if (!job.ok()) return Fail(job.status().message(), 1);
  out_ << (options_.json ? JobStatusToJson(job->job())
                         : FormatJobStatus(job->job(), absl::Now()));
  return 0;
}

int Command::Watch(const std::string& job_id) {
  absl::StatusOr<v1::MemberQuery> query = MembersToShow(job_id);
  if (absl::IsInvalidArgument(query.status())) {
    return Fail(query.status().message(), 2);
  }
  if (!query.ok()) return Fail(query.status().message(), 1);
  absl::Status watched = client_->WatchJob(
      job_id, options_.interval, /*with_buckets=*/options_.json,
      [&](const v1::JobStatus& job) {
        if (options_.json) {
          out_ << JobStatusToJsonLine(job) << std::flush;
          return true;
        }
        const absl::Time now = absl::Now();
        out_ << (options_.redraw ? "\033[H\033[2J" : "\n") << "gradsync watch "
             << job_id << "  "
             << absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone())
             << "\n\n"
             << FormatJobStatus(job, now) << std::flush;
        return true;
      },
      *query);
  if (!watched.ok()) return Fail(watched.message(), 1);
  return 0;
}

}  // namespace

int RunCommand(const std::vector<std::string>& args,
               const CommandOptions& options, CoordinatorClient* client,
               std::ostream& out, std::ostream& err) {
  Command command(options, client, out, err);
  const std::string name = args.empty() ? "" : args[0];
  if (name == "jobs" && args.size() == 1) return command.Jobs();
  if (name == "create" && args.size() == 2) return command.Create(args[1]);
  if (name == "token" && args.size() == 3 &&
      (args[1] == "rotate" || args[1] == "revoke")) {
    return command.Token(args[1], args[2]);
  }
  if (name == "status" && args.size() == 2) return command.Status(args[1]);
  if (name == "watch" && args.size() == 2) return command.Watch(args[1]);
  return command.Fail(
      absl::StrCat(args.empty() ? "no command" : "unknown command or wrong "
                                                 "arguments",
                   "\n", kCommandUsage),
      2);
}

}  // namespace gradsync
