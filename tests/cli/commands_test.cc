// The `gradsync` commands on a fake coordinator: what each prints, and the
// exit codes of bad usage (2) and of the coordinator's refusals (1).
#include "cli/commands.h"

#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

class CommandsTest : public ::testing::Test {
 protected:
  int Run(const std::vector<std::string>& args) {
    out_.str("");
    err_.str("");
    return RunCommand(args, options_, &fake_, out_, err_);
  }
  // A job of `world_size` ranks in `state`, round 1.
  void AddJob(const std::string& job_id, int world_size, v1::JobState state) {
    v1::JobStatus job;
    job.mutable_config()->set_job_id(job_id);
    job.set_state(state);
    job.set_round(1);
    job.set_world_size(world_size);
    for (int rank = 0; rank < world_size; ++rank) {
      v1::Member* member = job.add_members();
      member->set_rank(rank);
      member->set_state(v1::MEMBER_STATE_ACTIVE);
    }
    fake_.SetJob(job);
  }

  CommandOptions options_;
  FakeCoordinatorClient fake_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(CommandsTest, JobsListsEveryJob) {
  AddJob("train", 2, v1::JOB_STATE_RUNNING);
  AddJob("eval", 1, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Run({"jobs"}), 0);
  EXPECT_THAT(out_.str(), HasSubstr("train"));
  EXPECT_THAT(out_.str(), HasSubstr("eval"));
  EXPECT_THAT(err_.str(), IsEmpty());
}

TEST_F(CommandsTest, StatusShowsTheJobAndJsonIsOneDocument) {
  AddJob("train", 2, v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Run({"status", "train"}), 0);
  EXPECT_THAT(out_.str(), HasSubstr("train"));
  options_.json = true;
  EXPECT_EQ(Run({"status", "train"}), 0);
  EXPECT_THAT(out_.str(), StartsWith("{"));
  EXPECT_THAT(out_.str(), HasSubstr("\"train\""));
}

TEST_F(CommandsTest, TheCoordinatorsRefusalIsExitCodeOne) {
  EXPECT_EQ(Run({"status", "nowhere"}), 1);
  EXPECT_THAT(err_.str(), HasSubstr("no job 'nowhere'"));
  EXPECT_THAT(out_.str(), IsEmpty());
  EXPECT_EQ(Run({"token", "rotate", "train"}), 1);  // the fake has no tokens
  EXPECT_THAT(err_.str(), HasSubstr("no tokens"));
}

TEST_F(CommandsTest, BadUsageIsExitCodeTwoAndAsksNothing) {
  EXPECT_EQ(Run({}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("no command"));
  EXPECT_EQ(Run({"status"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("unknown command or wrong arguments"));
  options_.ranks = "7-3";
  EXPECT_EQ(Run({"status", "train"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--ranks: '7-3' is not FIRST-LAST"));
  options_.ranks.clear();
  options_.nnodes = "4:2";
  EXPECT_EQ(Run({"create", "new"}), 2);
  EXPECT_TRUE(absl::IsNotFound(fake_.GetJob("new", false).status()));
}

TEST_F(CommandsTest, CreateAsksForTheNodeRange) {
  options_.nnodes = "2:4";
  options_.nproc_per_node = 8;
  EXPECT_EQ(Run({"create", "new"}), 0) << err_.str();
  absl::StatusOr<v1::JobStatus> job = fake_.GetJob("new", false);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->config().min_nodes(), 2);
  EXPECT_EQ(job->config().max_nodes(), 4);
  EXPECT_EQ(job->config().nproc_per_node(), 8);
  EXPECT_EQ(Run({"create", "new"}), 1);  // it exists
  EXPECT_THAT(err_.str(), HasSubstr("exists"));
}

TEST_F(CommandsTest, WatchPrintsUpdatesUntilTheJobEnds) {
  AddJob("train", 2, v1::JOB_STATE_SUCCEEDED);
  options_.json = true;
  EXPECT_EQ(Run({"watch", "train"}), 0);
  // One JSON line per update; the job had ended already: one.
  const std::string text = out_.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_THAT(text, HasSubstr("\"state\":\"succeeded\""));
}

}  // namespace
}  // namespace gradsync
