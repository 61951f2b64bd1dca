// The real binaries as separate processes: gradsync-coordinator on a
// loopback port, gradsync-sim-worker processes that join and bootstrap
// through it, and the gradsync CLI reading the result.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/ports.h"
#include "tests/testing/subprocess.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::CoordinatorProcess;
using ::gradsync::testing::Hostname;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::WaitAll;

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Bounds for waiting on other processes.
constexpr absl::Duration kStartBound = absl::Seconds(20);
constexpr absl::Duration kWorkersBound = absl::Seconds(90);
constexpr absl::Duration kCliBound = absl::Seconds(20);
constexpr absl::Duration kStopBound = absl::Seconds(10);

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
  std::string describe;
};

class MultiprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_bin_ = Runfile("server/gradsync-coordinator");
    worker_bin_ = Runfile("worker/gradsync-sim-worker");
    cli_bin_ = Runfile("cli/gradsync");
    for (const std::string& bin : {coordinator_bin_, worker_bin_, cli_bin_}) {
      ASSERT_EQ(access(bin.c_str(), X_OK), 0) << bin << " is not executable";
    }
    StartCoordinator();
  }

  void TearDown() override {
    // Every test ends by stopping the coordinator as an operator would.
    if (coordinator_.child().running()) StopCoordinator();
  }

  void StartCoordinator() {
    const ::testing::TestInfo* info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    ASSERT_TRUE(coordinator_.Start(
        coordinator_bin_,
        absl::StrCat(info->test_suite_name(), ".", info->name())));
    address_ = coordinator_.address();
  }

  // SIGTERM, then the coordinator must exit 0 within kStopBound.
  void StopCoordinator() { EXPECT_TRUE(coordinator_.Stop(kStopBound)); }


  std::vector<std::string> WorkerArgs(const std::string& job, int nodes,
                                      int nproc, const std::string& node_id) {
    return {worker_bin_,
            absl::StrCat("--coordinator=", address_),
            absl::StrCat("--job=", job),
            absl::StrCat("--nnodes=", nodes),
            absl::StrCat("--nproc_per_node=", nproc),
            absl::StrCat("--node_id=", node_id),
            "--device=cpu",
            "--backend=auto",
            "--join_timeout=60s",
            "--bootstrap_timeout=60s"};
  }

  CliResult RunCli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {cli_bin_};
    argv.insert(argv.end(), args.begin(), args.end());
    Child cli;
    CliResult result;
    if (!cli.Start(argv, /*capture=*/true)) return result;
    bool finished = WaitAll({&cli}, kCliBound);
    EXPECT_TRUE(finished) << "the CLI did not finish: " << cli.describe();
    result.exit_code = cli.exit_code();
    result.out = cli.out();
    result.err = cli.err();
    result.describe = cli.describe();
    return result;
  }

  std::string coordinator_bin_;
  std::string worker_bin_;
  std::string cli_bin_;
  CoordinatorProcess coordinator_;
  std::string address_;
};

// ---------------------------------------------------------------------------
// Workers: N nodes x nproc_per_node processes

class WorkersTest : public MultiprocessTest,
                    public ::testing::WithParamInterface<std::tuple<int, int>> {
};

TEST_P(WorkersTest, WorkersGetDistinctRanksAndTheCliShowsThem) {
  const auto [nodes, nproc] = GetParam();
  const int world = nodes * nproc;
  const std::string job = absl::StrCat("sim-n", nodes, "-p", nproc);

  // One process per (node, local slot), each a separate gradsync-sim-worker.
  std::vector<std::unique_ptr<Child>> workers;
  std::vector<std::string> worker_node;  // node id of workers[i]
  for (int node = 0; node < nodes; ++node) {
    for (int local = 0; local < nproc; ++local) {
      const std::string node_id = absl::StrCat("node-", node);
      workers.push_back(std::make_unique<Child>());
      worker_node.push_back(node_id);
      ASSERT_TRUE(workers.back()->Start(WorkerArgs(job, nodes, nproc, node_id),
                                        /*capture=*/true));
    }
  }
  std::vector<Child*> all;
  for (auto& w : workers) all.push_back(w.get());
  ASSERT_TRUE(WaitAll(all, kWorkersBound))
      << "workers did not finish within "
      << absl::FormatDuration(kWorkersBound);

  // "rank R/W (local L/LW, node N/NN) round 1 backend gloo: bootstrapped
  // communicator XXXXXXXX"
  const std::regex line(
      R"(rank (\d+)/(\d+) \(local (\d+)/(\d+), node (\d+)/(\d+)\) round 1 )"
      R"(backend gloo: bootstrapped communicator ([0-9a-f]{8})\n)");
  std::set<int> ranks;
  std::set<std::string> communicators;
  std::map<std::string, std::set<int>> node_ranks_of_node;
  std::map<std::string, std::set<int>> local_ranks_of_node;
  std::set<int64_t> worker_pids;
  for (size_t i = 0; i < workers.size(); ++i) {
    const Child& w = *workers[i];
    SCOPED_TRACE(w.describe());
    worker_pids.insert(w.pid());
    ASSERT_EQ(w.exit_code(), 0);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(w.out(), m, line)) << "stdout: " << w.out();
    const int rank = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[2]), world);
    const int local = std::stoi(m[3]);
    EXPECT_EQ(std::stoi(m[4]), nproc);
    const int node_rank = std::stoi(m[5]);
    EXPECT_EQ(std::stoi(m[6]), nodes);
    EXPECT_EQ(rank, node_rank * nproc + local);
    ranks.insert(rank);
    communicators.insert(m[7]);
    node_ranks_of_node[worker_node[i]].insert(node_rank);
    local_ranks_of_node[worker_node[i]].insert(local);
  }
  // Ranks 0..W-1, each once; the processes of a node share its node rank
  // and have distinct local ranks; all agree on rank 0's communicator id.
  ASSERT_EQ(ranks.size(), static_cast<size_t>(world));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), world - 1);
  EXPECT_EQ(communicators.size(), 1u);
  std::set<int> node_ranks;
  for (const auto& [node_id, ranks_of_node] : node_ranks_of_node) {
    EXPECT_EQ(ranks_of_node.size(), 1u) << node_id;
    node_ranks.insert(*ranks_of_node.begin());
    EXPECT_EQ(local_ranks_of_node[node_id].size(), static_cast<size_t>(nproc))
        << node_id;
  }
  EXPECT_EQ(node_ranks.size(), static_cast<size_t>(nodes));

  // gradsync status JOB --json
  CliResult status = RunCli(
      {absl::StrCat("--coordinator=", address_), "status", job, "--json"});
  ASSERT_EQ(status.exit_code, 0) << status.describe;
  EXPECT_THAT(status.err, IsEmpty());
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(status.out)) << status.out;
  EXPECT_EQ(j["job"], job);
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["round"], 1);
  EXPECT_EQ(j["world_size"], world);
  EXPECT_EQ(j["backend"], "gloo");
  EXPECT_EQ(j["min_nodes"], nodes);
  EXPECT_EQ(j["max_nodes"], nodes);
  EXPECT_EQ(j["nproc_per_node"], nproc);
  ASSERT_TRUE(j["members"].is_array());
  ASSERT_EQ(j["members"].size(), static_cast<size_t>(world));
  std::set<int64_t> member_pids;
  for (int r = 0; r < world; ++r) {
    const nlohmann::json& m = j["members"][r];
    SCOPED_TRACE(m.dump());
    EXPECT_EQ(m["rank"], r);
    EXPECT_EQ(m["local_rank"], r % nproc);
    EXPECT_EQ(m["node_rank"], r / nproc);
    EXPECT_EQ(m["host"], Hostname());
    EXPECT_EQ(m["state"], "active");
    EXPECT_EQ(m["device"], "cpu");
    member_pids.insert(m["pid"].get<int64_t>());
  }
  // The members are exactly the worker processes this test started.
  EXPECT_EQ(member_pids, worker_pids);
  EXPECT_TRUE(j["waiting"].empty());
  EXPECT_TRUE(j["spares"].empty());

  // The table forms agree.
  CliResult table =
      RunCli({absl::StrCat("--coordinator=", address_), "status", job});
  ASSERT_EQ(table.exit_code, 0) << table.describe;
  EXPECT_THAT(table.out, HasSubstr("members (round 1):"));
  CliResult jobs =
      RunCli({absl::StrCat("--coordinator=", address_), "jobs", "--json"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.describe;
  nlohmann::json list = nlohmann::json::parse(jobs.out);
  ASSERT_EQ(list["jobs"].size(), 1u);
  EXPECT_EQ(list["jobs"][0]["job"], job);
  EXPECT_EQ(list["jobs"][0]["world_size"], world);

  StopCoordinator();
}

INSTANTIATE_TEST_SUITE_P(
    NodesByProcs, WorkersTest,
    ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
      return absl::StrCat(std::get<0>(info.param), "nodes_",
                          std::get<1>(info.param), "procs");
    });

// ---------------------------------------------------------------------------
// CLI errors

// Exactly one line on stderr.
void ExpectOneLine(const std::string& text) {
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
}

TEST_F(MultiprocessTest, CliStatusOfAnUnknownJobExitsOne) {
  CliResult r = RunCli(
      {absl::StrCat("--coordinator=", address_), "status", "unknown-job"});
  EXPECT_EQ(r.exit_code, 1) << r.describe;
  EXPECT_THAT(r.out, IsEmpty());
  ExpectOneLine(r.err);
  EXPECT_THAT(r.err, HasSubstr("not found"));
  EXPECT_THAT(r.err, HasSubstr("unknown-job"));
  // --json does not change the error.
  CliResult json = RunCli({absl::StrCat("--coordinator=", address_), "status",
                           "unknown-job", "--json"});
  EXPECT_EQ(json.exit_code, 1) << json.describe;
  ExpectOneLine(json.err);
}

TEST_F(MultiprocessTest, CliAgainstADeadPortExitsOne) {
  const std::string dead = absl::StrCat("127.0.0.1:", PickUnusedPort());
  for (const std::vector<std::string>& command :
       std::vector<std::vector<std::string>>{{"jobs"},
                                             {"status", "some-job"}}) {
    std::vector<std::string> args = {absl::StrCat("--coordinator=", dead),
                                     "--timeout=2s"};
    args.insert(args.end(), command.begin(), command.end());
    const absl::Time start = absl::Now();
    CliResult r = RunCli(args);
    EXPECT_LT(absl::Now() - start, kCliBound);
    EXPECT_EQ(r.exit_code, 1) << r.describe;
    EXPECT_THAT(r.out, IsEmpty());
    ExpectOneLine(r.err);
    EXPECT_THAT(r.err, HasSubstr("cannot reach"));
    EXPECT_THAT(r.err, HasSubstr(dead));
  }
}

TEST_F(MultiprocessTest, CliUsageErrorsExitTwo) {
  CliResult none = RunCli({absl::StrCat("--coordinator=", address_)});
  EXPECT_EQ(none.exit_code, 2) << none.describe;
  EXPECT_THAT(none.err, HasSubstr("no command"));
  EXPECT_THAT(none.out, IsEmpty());

  CliResult unknown =
      RunCli({absl::StrCat("--coordinator=", address_), "frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.describe;
  CliResult missing_job =
      RunCli({absl::StrCat("--coordinator=", address_), "status"});
  EXPECT_EQ(missing_job.exit_code, 2) << missing_job.describe;
  CliResult bad_address = RunCli({"--coordinator=no-port-here", "jobs"});
  EXPECT_EQ(bad_address.exit_code, 2) << bad_address.describe;
}

TEST_F(MultiprocessTest, CliListsNoJobsOnAFreshCoordinator) {
  CliResult r = RunCli({absl::StrCat("--coordinator=", address_), "jobs"});
  EXPECT_EQ(r.exit_code, 0) << r.describe;
  EXPECT_EQ(r.out, "no jobs\n");
  CliResult json =
      RunCli({absl::StrCat("--coordinator=", address_), "jobs", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.describe;
  EXPECT_TRUE(nlohmann::json::parse(json.out)["jobs"].empty());
}

// ---------------------------------------------------------------------------
// Stopping the coordinator

TEST_F(MultiprocessTest, CoordinatorExitsZeroOnSigterm) { StopCoordinator(); }

TEST_F(MultiprocessTest, CoordinatorExitsZeroOnSigtermWithAWaitingWorker) {
  // One worker of a two-node job waits in a join that is in flight.
  Child worker;
  ASSERT_TRUE(worker.Start(WorkerArgs("half", 2, 1, "only-node"),
                           /*capture=*/true));
  // Seen waiting through the CLI (another process: polled with a pause).
  const absl::Time deadline = absl::Now() + kStartBound;
  while (true) {
    CliResult r = RunCli(
        {absl::StrCat("--coordinator=", address_), "status", "half", "--json"});
    if (r.exit_code == 0 &&
        nlohmann::json::parse(r.out)["waiting"].size() == 1) {
      break;
    }
    ASSERT_LT(absl::Now(), deadline) << "the worker never showed up waiting";
    absl::SleepFor(absl::Milliseconds(20));
  }
  StopCoordinator();
  // The worker would keep retrying for a new coordinator; it is not the
  // subject here.
  worker.Signal(SIGKILL);
  EXPECT_TRUE(WaitAll({&worker}, kStopBound));
}

}  // namespace
}  // namespace gradsync
