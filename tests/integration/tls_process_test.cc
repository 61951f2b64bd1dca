// The coordinator binary serving over mutual TLS (--tls_cert, --tls_key,
// --tls_client_ca), with certificates the test makes with openssl: a worker
// and the CLI that present a certificate of the right CA are served (the
// job trains to SUCCEEDED); a client without a certificate, one whose
// certificate another CA signed, and a plaintext client are refused.
#include <httplib.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/channel_credentials.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_pki.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::Child;
using testing::CoordinatorProcess;
using testing::MakeTestCa;
using testing::MakeTestCert;
using testing::Runfile;
using testing::TempPath;
using testing::TestCa;
using testing::TestCert;
using testing::WaitAll;

constexpr absl::Duration kBound = absl::Seconds(60);

// Runs `argv` to completion; true when it exits 0.
bool RunTool(const std::vector<std::string>& argv, std::string* output = nullptr) {
  Child child;
  if (!child.Start(argv, /*capture=*/true)) return false;
  if (!WaitAll({&child}, kBound)) return false;
  if (output != nullptr) *output = child.out() + child.err();
  EXPECT_EQ(child.exit_code(), 0) << child.describe();
  return child.exit_code() == 0;
}

class TlsProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ca_ = MakeTestCa("gradsync-test");
    server_ = MakeTestCert(ca_, "coordinator");
    client_ = MakeTestCert(ca_, "worker");
    ASSERT_TRUE(coordinator_.Start(
        Runfile("server/gradsync-coordinator"), "tls",
        {"--tls_cert=" + server_.cert, "--tls_key=" + server_.key,
         "--tls_client_ca=" + ca_.cert, "--metrics_listen=127.0.0.1:0",
         "--metrics_port_file=" + TempPath("metrics-port")}));
    std::ifstream(TempPath("metrics-port")) >> http_port_;
  }
  void TearDown() override { EXPECT_TRUE(coordinator_.Stop()); }

  // A GetJob from a client with `tls`; its status.
  absl::Status Ask(const ClientTls& tls) {
    ClientOptions options;
    options.target = coordinator_.address();
    options.retry.budget = absl::Seconds(2);
    options.tls = tls;
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
        GrpcCoordinatorClient::Create(options);
    if (!client.ok()) return client.status();
    return (*client)->GetJob("tls").status();
  }

  TestCa ca_;
  TestCert server_, client_;
  CoordinatorProcess coordinator_;
  int http_port_ = 0;
};

// The metrics port serves HTTPS with the same certificate: a client that
// trusts the CA gets the metrics; plain HTTP gets nothing.
TEST_F(TlsProcessTest, TheMetricsPortServesHttps) {
  httplib::SSLClient https("127.0.0.1", http_port_);
  https.set_ca_cert_path(ca_.cert.c_str());
  https.enable_server_certificate_verification(true);
  httplib::Result result = https.Get("/metrics");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_THAT(result->body, HasSubstr("gradsync_"));
  httplib::Client plain("127.0.0.1", http_port_);
  plain.set_connection_timeout(2);
  plain.set_read_timeout(2);
  httplib::Result refused = plain.Get("/metrics");
  EXPECT_TRUE(!refused || refused->status != 200);
}

TEST_F(TlsProcessTest, AWorkerWithACertificateTrainsAndOthersAreRefused) {
  const std::vector<std::string> tls = {"--tls_ca=" + ca_.cert,
                                        "--tls_cert=" + client_.cert,
                                        "--tls_key=" + client_.key};
  std::vector<std::string> worker = {
      Runfile("worker/gradsync-sim-worker"),
      "--coordinator=" + coordinator_.address(), "--job=tls", "--nnodes=1",
      "--train_steps=20", "--step_time=10ms"};
  worker.insert(worker.end(), tls.begin(), tls.end());
  ASSERT_TRUE(RunTool(worker));
  std::vector<std::string> status = {Runfile("cli/gradsync"),
                                     "--coordinator=" + coordinator_.address(),
                                     "status", "tls"};
  status.insert(status.end(), tls.begin(), tls.end());
  std::string shown;
  ASSERT_TRUE(RunTool(status, &shown));
  EXPECT_THAT(shown, HasSubstr("all 1 member(s) of round 1 succeeded"));

  EXPECT_TRUE(Ask({ca_.cert, client_.cert, client_.key}).ok());
  // No client certificate: the handshake fails.
  absl::Status anonymous = Ask({ca_.cert, "", ""});
  EXPECT_TRUE(absl::IsUnavailable(anonymous)) << anonymous;
  // A certificate another CA signed.
  const TestCa rogue_ca = MakeTestCa("rogue");
  const TestCert rogue = MakeTestCert(rogue_ca, "rogue-worker");
  absl::Status foreign = Ask({ca_.cert, rogue.cert, rogue.key});
  EXPECT_TRUE(absl::IsUnavailable(foreign)) << foreign;
  // Plaintext.
  absl::Status plain = Ask({});
  EXPECT_TRUE(absl::IsUnavailable(plain)) << plain;
  // A coordinator certificate the client's CA did not sign.
  absl::Status distrusted = Ask({rogue_ca.cert, client_.cert, client_.key});
  EXPECT_TRUE(absl::IsUnavailable(distrusted)) << distrusted;
}

// The coordinator keeps its state in an etcd that takes only mutual TLS
// (--etcd_tls_ca/cert/key): a job trained through it is in etcd, as
// --check_state over TLS shows; without the flags the check is refused.
TEST_F(TlsProcessTest, TheCoordinatorTalksToEtcdOverMutualTls) {
  if (testing::EtcdProcess::Binary().empty()) {
    GTEST_SKIP() << "no etcd binary: install etcd-server";
  }
  const TestCert etcd_cert = MakeTestCert(ca_, "etcd");
  testing::EtcdProcess::Tls etcd_tls{etcd_cert.cert, etcd_cert.key, ca_.cert,
                                     {ca_.cert, server_.cert, server_.key}};
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start("coordinator-tls", &etcd_tls));
  const std::vector<std::string> to_etcd = {
      "--etcd=" + etcd.endpoint(), "--etcd_prefix=/tls/",
      "--etcd_tls_ca=" + ca_.cert, "--etcd_tls_cert=" + server_.cert,
      "--etcd_tls_key=" + server_.key};
  CoordinatorProcess durable;
  ASSERT_TRUE(durable.Start(Runfile("server/gradsync-coordinator"), "etcd-tls",
                            to_etcd));
  ASSERT_TRUE(RunTool({Runfile("worker/gradsync-sim-worker"),
                       "--coordinator=" + durable.address(), "--job=in-etcd",
                       "--nnodes=1", "--train_steps=5", "--step_time=1ms"}));
  ASSERT_TRUE(durable.Stop());

  std::vector<std::string> check = {Runfile("server/gradsync-coordinator"),
                                    "--check_state"};
  check.insert(check.end(), to_etcd.begin(), to_etcd.end());
  std::string shown;
  ASSERT_TRUE(RunTool(check, &shown));
  EXPECT_THAT(shown, HasSubstr("ok (state format"));
  EXPECT_THAT(shown, HasSubstr("1 jobs"));

  Child plain;
  ASSERT_TRUE(plain.Start({Runfile("server/gradsync-coordinator"), "--check_state",
                           "--etcd=" + etcd.endpoint(), "--etcd_prefix=/tls/"},
                          /*capture=*/true));
  ASSERT_TRUE(WaitAll({&plain}, kBound));
  EXPECT_EQ(plain.exit_code(), 1) << plain.describe();
}

TEST(TlsFlagsTest, IncompleteSettingsAreRefusedWithTheFlag) {
  EXPECT_THAT(MakeChannelCredentials({"", "cert.pem", "key.pem"}).status().message(),
              HasSubstr("--tls_cert needs --tls_ca"));
  EXPECT_THAT(MakeChannelCredentials({"ca.pem", "cert.pem", ""}).status().message(),
              HasSubstr("--tls_cert and --tls_key go together"));
  EXPECT_THAT(MakeChannelCredentials({"", "cert.pem", "key.pem"}, "--etcd_tls")
                  .status()
                  .message(),
              HasSubstr("--etcd_tls_cert needs --etcd_tls_ca"));
  absl::Status missing = MakeChannelCredentials({TempPath("none.pem"), "", ""}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("--tls_ca: cannot read"));
  // The coordinator refuses to start on a half-given TLS setting.
  Child coordinator;
  ASSERT_TRUE(coordinator.Start({Runfile("server/gradsync-coordinator"),
                                 "--listen=127.0.0.1:0", "--tls_key=k.pem"},
                                /*capture=*/true));
  ASSERT_TRUE(WaitAll({&coordinator}, kBound));
  EXPECT_EQ(coordinator.exit_code(), 1);
  EXPECT_THAT(coordinator.err(), HasSubstr("--tls_key and --tls_client_ca need --tls_cert"));
}

}  // namespace
}  // namespace gradsync
