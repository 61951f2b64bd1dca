// The status page in a real browser: headless Chromium loads it from a
// gradsync-coordinator while 2 simulated workers train, runs its script
// (which polls the JSON API), and the rendered page shows the job, one row
// per rank and a step-time line per rank; a screenshot is kept as a test
// artifact (TEST_UNDECLARED_OUTPUTS_DIR).
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include <httplib.h>
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::Child;
using testing::CoordinatorProcess;
using testing::PumpUntil;
using testing::Runfile;
using testing::TempPath;
using testing::WaitAll;

constexpr absl::Duration kBound = absl::Seconds(60);
constexpr char kChromium[] = "/usr/bin/chromium";

// Chromium, headless, on `url`: its script runs for `virtual_ms` of virtual
// time, then `flags` (--dump-dom, --screenshot=...) act on the page.
Child* Browse(Child* child, const std::string& url, int virtual_ms,
              const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {
      kChromium, "--headless", "--no-sandbox", "--disable-gpu",
      "--hide-scrollbars", "--window-size=1000,700",
      absl::StrCat("--user-data-dir=", TempPath("chromium-profile")),
      absl::StrCat("--virtual-time-budget=", virtual_ms)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(url);
  EXPECT_TRUE(child->Start(argv, /*capture=*/true));
  return child;
}

TEST(StatusPageTest, ChromiumShowsEveryRankOfATrainingJob) {
  if (access(kChromium, X_OK) != 0) {
    FAIL() << kChromium << " is missing: install Debian's chromium "
           << "(deploy/install_deps.sh does)";
  }
  const std::string metrics_port = TempPath("metrics-port");
  CoordinatorProcess coordinator;
  ASSERT_TRUE(coordinator.Start(Runfile("server/gradsync-coordinator"), "web",
                                {"--metrics_listen=127.0.0.1:0",
                                 "--metrics_port_file=" + metrics_port}));
  std::string port;
  std::ifstream(metrics_port) >> port;
  ASSERT_FALSE(port.empty());
  const std::string base = "http://127.0.0.1:" + port;

  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<Child>());
    ASSERT_TRUE(workers.back()->Start(
        {Runfile("worker/gradsync-sim-worker"),
         "--coordinator=" + coordinator.address(), "--job=web", "--nnodes=2",
         absl::StrCat("--node_id=node", i), "--train_steps=600",
         "--step_time=50ms"},
        /*capture=*/true));
  }
  // Until both ranks report step times.
  ClientOptions options;
  options.target = coordinator.address();
  auto client = *GrpcCoordinatorClient::Create(options);
  std::vector<Child*> children = {workers[0].get(), workers[1].get()};
  ASSERT_TRUE(PumpUntil(children, kBound, [&] {
    absl::StatusOr<v1::JobStatus> job = client->GetJob("web");
    if (!job.ok() || job->members_size() != 2) return false;
    for (const v1::Member& m : job->members()) {
      if (m.metrics().step_timings().step_seconds() <= 0) return false;
    }
    return true;
  }));

  // The job's page after a few of its refreshes.
  Child page;
  Browse(&page, base + "/?job=web", 3000, {"--dump-dom"});
  ASSERT_TRUE(WaitAll({&page}, kBound));
  ASSERT_EQ(page.exit_code(), 0) << page.describe();
  const std::string& dom = page.out();
  EXPECT_THAT(dom, HasSubstr("gradsync: job web"));
  EXPECT_THAT(dom, HasSubstr("class=\"state-running\">running"));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(dom, HasSubstr(absl::StrCat("<tr id=\"rank-", rank, "\">")));
    EXPECT_THAT(dom, HasSubstr(absl::StrCat("<polyline id=\"line-", rank)));
  }
  EXPECT_THAT(dom, HasSubstr("50.0 ms")) << "the step time, in the table";
  EXPECT_THAT(dom, HasSubstr("<p id=\"error\"></p>")) << "a refresh failed";
  EXPECT_THAT(dom, HasSubstr("members: 2 active, 0 lost, 0 exited"));

  // /api/job chooses its members by query; a bad one is a 400.
  httplib::Client http("127.0.0.1", std::stoi(port));
  auto none = http.Get("/api/job?id=web&members=none");
  ASSERT_TRUE(none) << "no answer from /api/job";
  EXPECT_EQ(none->status, 200);
  EXPECT_THAT(none->body, HasSubstr("\"summary\""));
  EXPECT_THAT(none->body, HasSubstr("\"members\":[]"));
  auto one = http.Get("/api/job?id=web&members=all&from=1&to=2");
  ASSERT_TRUE(one);
  const std::vector<std::string> pieces =
      absl::StrSplit(one->body, "\"node_rank\"");
  EXPECT_EQ(pieces.size(), 2u) << "one member listed: " << one->body;
  EXPECT_THAT(one->body, HasSubstr("\"rank\":1,"));
  auto bad = http.Get("/api/job?id=web&members=some");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("use all, unhealthy, none or auto"));

  // The list of jobs links to it.
  Child list;
  Browse(&list, base + "/", 1000, {"--dump-dom"});
  ASSERT_TRUE(WaitAll({&list}, kBound));
  EXPECT_THAT(list.out(), HasSubstr("<tr id=\"job-web\">"));
  EXPECT_THAT(list.out(), HasSubstr("href=\"?job=web\""));

  // A screenshot for people, kept with the test's outputs.
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string png =
      absl::StrCat(outputs != nullptr ? outputs : TempPath(""), "/status_page.png");
  Child shot;
  Browse(&shot, base + "/?job=web", 3000, {"--screenshot=" + png});
  ASSERT_TRUE(WaitAll({&shot}, kBound));
  std::ifstream image(png, std::ios::binary | std::ios::ate);
  EXPECT_GT(static_cast<int64_t>(image.tellg()), 1000) << png;

  for (auto& w : workers) w->Signal(SIGTERM);
  WaitAll(children, kBound);
  EXPECT_TRUE(coordinator.Stop());
}

}  // namespace
}  // namespace gradsync
