// Per-job tokens with the real binaries (--auth=token): the admin creates
// jobs with `gradsync create` and gets their tokens; a call without a token
// or with an unknown one is UNAUTHENTICATED; job A's token cannot join B,
// read, write or wait on B's keys, read B's status or create jobs
// (PERMISSION_DENIED, B unchanged) and lists only A; a worker with A's
// token trains A to SUCCEEDED; tokens outlive a restart on the same state;
// the admin rotates and revokes a job's token (`gradsync token`).
#include <httplib.h>

#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::Child;
using testing::CoordinatorProcess;
using testing::Runfile;
using testing::TempPath;
using testing::WaitAll;

constexpr absl::Duration kBound = absl::Seconds(60);

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text << "\n";
  return path;
}

class AuthProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    admin_file_ = WriteFile("admin-token", "admin-secret-0123");
    state_dir_ = TempPath("state");
    StartCoordinator("auth");
  }
  void TearDown() override { EXPECT_TRUE(coordinator_->Stop()); }

  // A coordinator (`name` makes its port file unique) on the test's state.
  void StartCoordinator(const std::string& name) {
    coordinator_ = std::make_unique<CoordinatorProcess>();
    ASSERT_TRUE(coordinator_->Start(
        Runfile("server/gradsync-coordinator"), name,
        {"--auth=token", "--admin_token_file=" + admin_file_,
         "--state_dir=" + state_dir_, "--metrics_listen=127.0.0.1:0",
         "--metrics_port_file=" + TempPath("metrics-port-" + name)}));
    std::ifstream(TempPath("metrics-port-" + name)) >> http_port_;
  }

  std::unique_ptr<CoordinatorClient> Client(const std::string& token) {
    ClientOptions options;
    options.target = coordinator_->address();
    options.token = token;
    options.retry.budget = absl::Seconds(5);
    return *GrpcCoordinatorClient::Create(options);
  }

  // `gradsync create JOB --nnodes=N --json` as the admin: the job's token.
  std::string Create(const std::string& job, int nodes) {
    Child cli;
    EXPECT_TRUE(cli.Start({Runfile("cli/gradsync"),
                           "--coordinator=" + coordinator_->address(),
                           "--token_file=" + admin_file_, "create", job,
                           absl::StrCat("--nnodes=", nodes), "--json"},
                          /*capture=*/true));
    EXPECT_TRUE(WaitAll({&cli}, kBound));
    EXPECT_EQ(cli.exit_code(), 0) << cli.describe();
    std::smatch token;
    const std::string& out = cli.out();
    EXPECT_TRUE(std::regex_search(out, token,
                                  std::regex("\"token\": \"([0-9a-f]{64})\"")))
        << out;
    return token.size() > 1 ? token[1].str() : "";
  }

  // `gradsync ARGS...` as the admin; its stdout (empty when it failed).
  std::string AdminCli(const std::vector<std::string>& args) {
    Child cli;
    std::vector<std::string> argv = {Runfile("cli/gradsync"),
                                     "--coordinator=" + coordinator_->address(),
                                     "--token_file=" + admin_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_TRUE(cli.Start(argv, /*capture=*/true));
    EXPECT_TRUE(WaitAll({&cli}, kBound));
    EXPECT_EQ(cli.exit_code(), 0) << cli.describe();
    return cli.exit_code() == 0 ? cli.out() : "";
  }

  // GET `path` on the HTTP port with `token` (none when empty): its status.
  int HttpGet(const std::string& path, const std::string& token) {
    httplib::Client http("127.0.0.1", http_port_);
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    httplib::Result result = http.Get(path, headers);
    return result ? result->status : -1;
  }

  std::string admin_file_, state_dir_;
  int http_port_ = 0;
  std::unique_ptr<CoordinatorProcess> coordinator_;
};

TEST_F(AuthProcessTest, AJobsTokenActsOnlyInItsJob) {
  const std::string a = Create("a", 1);
  const std::string b = Create("b", 2);
  ASSERT_FALSE(a.empty());
  ASSERT_NE(a, b);

  // No token, an unknown one.
  EXPECT_TRUE(absl::IsUnauthenticated(Client("")->ListJobs().status()));
  EXPECT_TRUE(absl::IsUnauthenticated(Client("f00")->GetJob("a").status()));

  auto as_a = Client(a);
  EXPECT_TRUE(absl::IsPermissionDenied(as_a->GetJob("b").status()));
  v1::JoinRequest join_b;
  join_b.set_job_id("b");
  *join_b.mutable_node() = LocalNodeDescriptor();
  EXPECT_TRUE(absl::IsPermissionDenied(as_a->Join(join_b).status()));
  v1::Scope scope_b;
  scope_b.set_job_id("b");
  scope_b.set_round(1);
  EXPECT_TRUE(absl::IsPermissionDenied(as_a->Set(scope_b, "k", "v")));
  EXPECT_TRUE(absl::IsPermissionDenied(as_a->Get(scope_b, "k").status()));
  EXPECT_TRUE(
      absl::IsPermissionDenied(as_a->Wait(scope_b, {"k"}, absl::Seconds(1))));
  absl::Status watched = as_a->WatchJob(
      "b", absl::Seconds(1), false, [](const v1::JobStatus&) { return true; });
  EXPECT_TRUE(absl::IsPermissionDenied(watched)) << watched;
  v1::JobConfig c;
  c.set_job_id("c");
  EXPECT_TRUE(absl::IsPermissionDenied(as_a->CreateJob(c).status()));
  absl::StatusOr<std::vector<v1::JobStatus>> listed = as_a->ListJobs();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].config().job_id(), "a");

  // B is as it was; the admin sees everything. Jobs come only from
  // `gradsync create` here: not even the admin's join makes one.
  auto admin = Client("admin-secret-0123");
  v1::JoinRequest join_new;
  join_new.set_job_id("new");
  join_new.mutable_config()->set_job_id("new");
  join_new.mutable_config()->set_min_nodes(1);
  *join_new.mutable_node() = LocalNodeDescriptor();
  absl::StatusOr<v1::Assignment> made = admin->Join(join_new);
  EXPECT_TRUE(absl::IsFailedPrecondition(made.status())) << made.status();
  EXPECT_THAT(made.status().message(), HasSubstr("--create_jobs_on_join"));
  absl::StatusOr<v1::JobStatus> job_b = admin->GetJob("b");
  ASSERT_TRUE(job_b.ok()) << job_b.status();
  EXPECT_EQ(job_b->state(), v1::JOB_STATE_WAITING);
  EXPECT_EQ(job_b->round(), 0);
  EXPECT_EQ(job_b->waiting_size(), 0);
  EXPECT_EQ(admin->ListJobs()->size(), 2u);

  // The HTTP port answers the same way.
  EXPECT_EQ(HttpGet("/api/job?id=a", a), 200);
  EXPECT_EQ(HttpGet("/api/job?id=b", a), 403);
  EXPECT_EQ(HttpGet("/api/job?id=a", ""), 401);
  EXPECT_EQ(HttpGet("/metrics", a), 403);  // the admin's
  EXPECT_EQ(HttpGet("/metrics", "admin-secret-0123"), 200);
  EXPECT_EQ(HttpGet("/", ""), 200);  // the page itself holds no data

  // A worker with A's token trains A to the end.
  Child worker;
  ASSERT_TRUE(worker.Start(
      {Runfile("worker/gradsync-sim-worker"),
       "--coordinator=" + coordinator_->address(), "--job=a", "--nnodes=1",
       "--token_file=" + WriteFile("a-token", a), "--train_steps=5",
       "--step_time=10ms"},
      /*capture=*/true));
  ASSERT_TRUE(WaitAll({&worker}, kBound));
  EXPECT_EQ(worker.exit_code(), 0) << worker.describe();
  EXPECT_EQ(as_a->GetJob("a")->state(), v1::JOB_STATE_SUCCEEDED);

  // Tokens are kept (as hashes) with the durable state.
  ASSERT_TRUE(coordinator_->Stop());
  StartCoordinator("auth-again");
  absl::StatusOr<v1::JobStatus> after = Client(a)->GetJob("a");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(absl::IsPermissionDenied(Client(a)->GetJob("b").status()));
}

TEST_F(AuthProcessTest, TheAdminRotatesAndRevokesAJobsToken) {
  const std::string old_token = Create("r", 1);
  ASSERT_FALSE(old_token.empty());
  std::smatch match;
  const std::string rotated = AdminCli({"token", "rotate", "r"});
  ASSERT_TRUE(std::regex_search(rotated, match, std::regex("^([0-9a-f]{64})\n$")))
      << rotated;
  const std::string new_token = match[1].str();
  EXPECT_NE(new_token, old_token);
  EXPECT_TRUE(absl::IsUnauthenticated(Client(old_token)->GetJob("r").status()));
  ASSERT_TRUE(Client(new_token)->GetJob("r").ok());

  // Only the admin, only for jobs that exist.
  EXPECT_TRUE(absl::IsPermissionDenied(
      Client(new_token)->RotateToken("r").status()));
  EXPECT_TRUE(absl::IsPermissionDenied(Client(new_token)->RevokeToken("r")));
  auto admin = Client("admin-secret-0123");
  EXPECT_TRUE(absl::IsNotFound(admin->RotateToken("nobody").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(admin->RevokeToken("no such/id")));

  EXPECT_THAT(AdminCli({"token", "revoke", "r"}),
              HasSubstr("job 'r': token revoked"));
  EXPECT_TRUE(absl::IsUnauthenticated(Client(new_token)->GetJob("r").status()));
  EXPECT_TRUE(admin->GetJob("r").ok());
  EXPECT_TRUE(admin->RevokeToken("r").ok()) << "revoking again is OK";

  // Both kept with the durable state; a revoked job can get a token again.
  ASSERT_TRUE(coordinator_->Stop());
  StartCoordinator("auth-rotated");
  EXPECT_TRUE(absl::IsUnauthenticated(Client(new_token)->GetJob("r").status()));
  absl::StatusOr<std::string> again = Client("admin-secret-0123")->RotateToken("r");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(Client(*again)->GetJob("r").ok());

  // A coordinator without tokens has none to rotate.
  CoordinatorProcess open;
  ASSERT_TRUE(open.Start(Runfile("server/gradsync-coordinator"), "open"));
  ClientOptions options;
  options.target = open.address();
  absl::StatusOr<std::string> none =
      (*GrpcCoordinatorClient::Create(options))->RotateToken("r");
  EXPECT_TRUE(absl::IsFailedPrecondition(none.status())) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr("--auth=none"));
  EXPECT_TRUE(open.Stop());
}

}  // namespace
}  // namespace gradsync
