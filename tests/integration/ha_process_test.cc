// Coordinator replicas on one etcd (--etcd with the same --etcd_prefix):
// the leader serves, the standby answers every call with the leader's
// address. Killing the
// leader with SIGKILL while two workers train hands the job to the standby
// (the workers, given both addresses, follow). A leader stopped with
// SIGSTOP is replaced as well: the workers find it frozen by keepalive and
// follow; resumed, it exits instead of writing. A real etcd-server is
// started by the test on loopback.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/eventually.h"
#include "tests/testing/ports.h"
#include "tests/testing/subprocess.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Child;
using ::gradsync::testing::EtcdProcess;
using ::gradsync::testing::Runfile;
using ::gradsync::testing::TempPath;
using ::gradsync::testing::WaitAll;

constexpr absl::Duration kBound = absl::Seconds(60);
// The goal is 5 s from the kill to the standby serving; the bound
// leaves room for a loaded test machine.
constexpr absl::Duration kFailoverBound = absl::Seconds(15);

// One coordinator replica on a fixed loopback port, started as a child
// process; it writes its port file only once it leads and serves.
class Replica {
 public:
  Replica(const std::string& name, const std::string& etcd)
      : port_(PickUnusedPort()), port_file_(TempPath("port-" + name)) {
    std::remove(port_file_.c_str());
    EXPECT_TRUE(child_.Start(
        {Runfile("server/gradsync-coordinator"),
         absl::StrCat("--listen=127.0.0.1:", port_),
         absl::StrCat("--port_file=", port_file_), "--poll_interval=5ms",
         "--shutdown_grace=500ms", absl::StrCat("--etcd=", etcd),
         "--etcd_prefix=/ha/"},
        /*capture=*/false));
  }

  // Whether it serves (its port file is complete).
  bool serving() const {
    std::ifstream in(port_file_);
    std::string text((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    return !text.empty() && text.back() == '\n';
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  Child& child() { return child_; }

 private:
  const int port_;
  const std::string port_file_;
  Child child_;
};

class HaProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::Binary().empty()) {
      GTEST_SKIP() << "no etcd binary: install etcd-server";
    }
    ASSERT_TRUE(etcd_.Start("ha"));
    a_ = std::make_unique<Replica>("a", etcd_.endpoint());
    ASSERT_TRUE(Eventually([&] { return a_->serving(); }, kBound))
        << "the first replica never led";
    b_ = std::make_unique<Replica>("b", etcd_.endpoint());
    // b stands by: give it time to try, then check it does not serve.
    absl::SleepFor(absl::Milliseconds(500));
    ASSERT_FALSE(b_->serving()) << "two replicas serve at once";
    ClientOptions options;
    options.target = absl::StrCat(a_->address(), ",", b_->address());
    client_ = *GrpcCoordinatorClient::Create(options);
  }

  void TearDown() override {
    for (Replica* r : {a_.get(), b_.get()}) {
      if (r == nullptr) continue;
      r->child().Signal(SIGCONT);
      r->child().Signal(SIGTERM);
      EXPECT_TRUE(WaitAll({&r->child()}, kBound));
    }
  }

  // Two sim workers of job `job` (2 nodes), training `steps` 50 ms steps,
  // told both replicas (the standby's address first with `standby_first`).
  std::vector<std::unique_ptr<Child>> StartWorkers(const std::string& job,
                                                   int steps,
                                                   bool standby_first = false) {
    const std::string replicas =
        standby_first ? absl::StrCat(b_->address(), ",", a_->address())
                      : absl::StrCat(a_->address(), ",", b_->address());
    std::vector<std::unique_ptr<Child>> workers;
    for (int i = 0; i < 2; ++i) {
      workers.push_back(std::make_unique<Child>());
      EXPECT_TRUE(workers.back()->Start(
          {Runfile("worker/gradsync-sim-worker"),
           absl::StrCat("--coordinator=", replicas),
           absl::StrCat("--job=", job), "--nnodes=2",
           absl::StrCat("--node_id=node-", i), "--last_call_timeout=0s",
           absl::StrCat("--train_steps=", steps), "--step_time=50ms"},
          /*capture=*/true));
    }
    return workers;
  }

  // Whether both members of `job` report a step past `past` through
  // `client` (default client_); sets `*step` to the larger one.
  bool BothReport(const std::string& job, int64_t past, int64_t* step,
                  CoordinatorClient* client = nullptr) {
    absl::StatusOr<v1::JobStatus> status =
        (client != nullptr ? client : client_.get())->GetJob(job);
    if (!status.ok() || status->members_size() != 2) return false;
    *step = std::max(status->members(0).metrics().step(),
                     status->members(1).metrics().step());
    return status->members(0).metrics().step() > past &&
           status->members(1).metrics().step() > past;
  }

  // The workers exit 0 and the job SUCCEEDED in round 1: no member was
  // ever lost.
  void ExpectSucceededWithoutALoss(
      const std::string& job, std::vector<std::unique_ptr<Child>>* workers,
      CoordinatorClient* client) {
    std::vector<Child*> all;
    for (auto& w : *workers) all.push_back(w.get());
    ASSERT_TRUE(WaitAll(all, kBound));
    for (auto& w : *workers) EXPECT_EQ(w->exit_code(), 0) << w->describe();
    absl::StatusOr<v1::JobStatus> status = client->GetJob(job);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->state(), v1::JOB_STATE_SUCCEEDED) << status->reason();
    EXPECT_EQ(status->round(), 1) << "no member was lost: no recovery";
    for (const v1::Member& m : status->members()) {
      EXPECT_EQ(m.state(), v1::MEMBER_STATE_EXITED) << m.state_reason();
    }
  }

  EtcdProcess etcd_;
  std::unique_ptr<Replica> a_, b_;
  std::unique_ptr<CoordinatorClient> client_;
};

// The workers are given the standby's address first: it answers with the
// leader's, and they follow.
TEST_F(HaProcessTest, KilledLeaderIsReplacedAndTheJobSucceeds) {
  std::vector<std::unique_ptr<Child>> workers =
      StartWorkers("ha", 200, /*standby_first=*/true);
  int64_t step_at_kill = 0;
  ASSERT_TRUE(
      Eventually([&] { return BothReport("ha", 0, &step_at_kill); }, kBound));
  a_->child().Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitAll({&a_->child()}, kBound));
  ASSERT_TRUE(Eventually([&] { return b_->serving(); }, kFailoverBound))
      << "the standby did not take over";
  const absl::Duration took_over = absl::Now() - killed;
  // Both workers heartbeat to the new leader with steps past the kill.
  int64_t step_on_b = 0;
  ASSERT_TRUE(Eventually(
      [&] { return BothReport("ha", step_at_kill, &step_on_b); },
      kFailoverBound));
  const absl::Duration followed = absl::Now() - killed;
  std::printf("standby serving %s after the leader's SIGKILL; both workers "
              "reporting to it after %s\n",
              absl::FormatDuration(took_over).c_str(),
              absl::FormatDuration(followed).c_str());
  EXPECT_LE(followed, kFailoverBound);
  ExpectSucceededWithoutALoss("ha", &workers, client_.get());
}

// A leader that stops without closing its connections (SIGSTOP: a pause, a
// partition): the standby takes over when its lease expires, and the
// workers, whose calls and heartbeat stream stay connected to the frozen
// leader, find it by keepalive and move to the new one within its grace:
// no member is lost. Resumed, the old leader exits.
TEST_F(HaProcessTest, WorkersLeaveAStoppedLeaderThatExitsWhenItResumes) {
  std::vector<std::unique_ptr<Child>> workers = StartWorkers("frozen", 400);
  int64_t step_at_stop = 0;
  ASSERT_TRUE(Eventually([&] { return BothReport("frozen", 0, &step_at_stop); },
                         kBound));
  a_->child().Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(Eventually([&] { return b_->serving(); }, kFailoverBound))
      << "the standby did not take over";
  const absl::Duration took_over = absl::Now() - stopped;
  // (Asked directly: client_ tries the stopped leader first.)
  ClientOptions options;
  options.target = b_->address();
  std::unique_ptr<CoordinatorClient> to_b = *GrpcCoordinatorClient::Create(options);
  int64_t step_on_b = 0;
  ASSERT_TRUE(Eventually(
      [&] { return BothReport("frozen", step_at_stop, &step_on_b, to_b.get()); },
      kBound))
      << "the workers did not move to the new leader";
  const absl::Duration followed = absl::Now() - stopped;
  std::printf("standby serving %s after the leader's SIGSTOP; both workers "
              "reporting to it after %s\n",
              absl::FormatDuration(took_over).c_str(),
              absl::FormatDuration(followed).c_str());
  // Inside the grace the new leader gives members (5 detection windows of
  // 3 s); the job's outcome below shows that no member was found lost.
  EXPECT_LE(followed - took_over, absl::Seconds(15));
  // Resumed, the old leader finds its lease gone and exits 1 rather than
  // write (its writes are fenced: etcd_storage_test shows they fail).
  a_->child().Signal(SIGCONT);
  ASSERT_TRUE(WaitAll({&a_->child()}, kFailoverBound));
  EXPECT_EQ(a_->child().exit_code(), 1) << a_->child().describe();
  ExpectSucceededWithoutALoss("frozen", &workers, to_b.get());
}

}  // namespace
}  // namespace gradsync
