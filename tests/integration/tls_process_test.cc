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
#include "tests/testing/subprocess.h"
#include "worker/client/channel_credentials.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::Child;
using testing::CoordinatorProcess;
using testing::Runfile;
using testing::TempPath;
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

// A CA and a certificate it signs, as PEM files under TempPath(name...).
struct Pki {
  std::string ca, ca_key;
};

// Makes a self-signed CA called `name`.
Pki MakeCa(const std::string& name) {
  Pki pki{TempPath(name + "-ca.pem"), TempPath(name + "-ca.key")};
  EXPECT_TRUE(RunTool({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec",
                       "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                       "-keyout", pki.ca_key, "-out", pki.ca, "-days", "2",
                       "-subj", "/CN=" + name}));
  return pki;
}

// Makes `name`.pem and `name`.key, signed by `ca`, valid for 127.0.0.1.
std::pair<std::string, std::string> MakeCert(const Pki& ca,
                                             const std::string& name) {
  const std::string cert = TempPath(name + ".pem"), key = TempPath(name + ".key");
  const std::string csr = TempPath(name + ".csr"), ext = TempPath(name + ".ext");
  std::ofstream(ext) << "subjectAltName=IP:127.0.0.1\n";
  EXPECT_TRUE(RunTool({"/usr/bin/openssl", "req", "-newkey", "ec", "-pkeyopt",
                       "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                       "-out", csr, "-subj", "/CN=" + name}));
  EXPECT_TRUE(RunTool({"/usr/bin/openssl", "x509", "-req", "-in", csr, "-CA",
                       ca.ca, "-CAkey", ca.ca_key, "-CAcreateserial", "-out",
                       cert, "-days", "2", "-extfile", ext}));
  return {cert, key};
}

class TlsProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ca_ = MakeCa("gradsync-test");
    server_ = MakeCert(ca_, "coordinator");
    client_ = MakeCert(ca_, "worker");
    ASSERT_TRUE(coordinator_.Start(
        Runfile("server/gradsync-coordinator"), "tls",
        {"--tls_cert=" + server_.first, "--tls_key=" + server_.second,
         "--tls_client_ca=" + ca_.ca, "--metrics_listen=127.0.0.1:0",
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
        CoordinatorClient::Create(options);
    if (!client.ok()) return client.status();
    return (*client)->GetJob("tls").status();
  }

  Pki ca_;
  std::pair<std::string, std::string> server_, client_;
  CoordinatorProcess coordinator_;
  int http_port_ = 0;
};

// The metrics port serves HTTPS with the same certificate: a client that
// trusts the CA gets the metrics; plain HTTP gets nothing.
TEST_F(TlsProcessTest, TheMetricsPortServesHttps) {
  httplib::SSLClient https("127.0.0.1", http_port_);
  https.set_ca_cert_path(ca_.ca.c_str());
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
  const std::vector<std::string> tls = {"--tls_ca=" + ca_.ca,
                                        "--tls_cert=" + client_.first,
                                        "--tls_key=" + client_.second};
  std::vector<std::string> worker = {
      Runfile("worker/gradsync-sim-worker"),
      "--coordinator=" + coordinator_.address(), "--job=tls", "--nnodes=1",
      "--train_steps=20", "--step_time=10ms"};
  worker.insert(worker.end(), tls.begin(), tls.end());
  ASSERT_TRUE(RunTool(worker));
  std::vector<std::string> status = {Runfile("worker/cli/gradsync"),
                                     "--coordinator=" + coordinator_.address(),
                                     "status", "tls"};
  status.insert(status.end(), tls.begin(), tls.end());
  std::string shown;
  ASSERT_TRUE(RunTool(status, &shown));
  EXPECT_THAT(shown, HasSubstr("all 1 member(s) of round 1 succeeded"));

  EXPECT_TRUE(Ask({ca_.ca, client_.first, client_.second}).ok());
  // No client certificate: the handshake fails.
  absl::Status anonymous = Ask({ca_.ca, "", ""});
  EXPECT_TRUE(absl::IsUnavailable(anonymous)) << anonymous;
  // A certificate another CA signed.
  const Pki rogue_ca = MakeCa("rogue");
  const auto rogue = MakeCert(rogue_ca, "rogue-worker");
  absl::Status foreign = Ask({ca_.ca, rogue.first, rogue.second});
  EXPECT_TRUE(absl::IsUnavailable(foreign)) << foreign;
  // Plaintext.
  absl::Status plain = Ask({});
  EXPECT_TRUE(absl::IsUnavailable(plain)) << plain;
  // A coordinator certificate the client's CA did not sign.
  absl::Status distrusted = Ask({rogue_ca.ca, client_.first, client_.second});
  EXPECT_TRUE(absl::IsUnavailable(distrusted)) << distrusted;
}

TEST(TlsFlagsTest, IncompleteSettingsAreRefusedWithTheFlag) {
  EXPECT_THAT(MakeChannelCredentials({"", "cert.pem", "key.pem"}).status().message(),
              HasSubstr("--tls_cert needs --tls_ca"));
  EXPECT_THAT(MakeChannelCredentials({"ca.pem", "cert.pem", ""}).status().message(),
              HasSubstr("--tls_cert and --tls_key go together"));
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
