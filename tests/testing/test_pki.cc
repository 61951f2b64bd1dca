#include "tests/testing/test_pki.h"

#include <fstream>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace gradsync {
namespace testing {
namespace {

// Runs openssl with `args` to completion; a test failure unless it exits 0.
void RunOpenssl(std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/openssl");
  Child child;
  ASSERT_TRUE(child.Start(args, /*capture=*/true));
  ASSERT_TRUE(WaitAll({&child}, absl::Seconds(60)));
  EXPECT_EQ(child.exit_code(), 0) << child.describe();
}

}  // namespace

TestCa MakeTestCa(const std::string& name) {
  TestCa ca{TempPath(name + "-ca.pem"), TempPath(name + "-ca.key")};
  RunOpenssl({"req", "-x509", "-newkey", "ec", "-pkeyopt",
              "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", ca.key,
              "-out", ca.cert, "-days", "2", "-subj", "/CN=" + name});
  return ca;
}

TestCert MakeTestCert(const TestCa& ca, const std::string& name) {
  TestCert cert{TempPath(name + ".pem"), TempPath(name + ".key")};
  const std::string csr = TempPath(name + ".csr"), ext = TempPath(name + ".ext");
  std::ofstream(ext) << "subjectAltName=IP:127.0.0.1\n"
                     << "extendedKeyUsage=serverAuth,clientAuth\n";
  RunOpenssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
              "-nodes", "-keyout", cert.key, "-out", csr, "-subj", "/CN=" + name});
  RunOpenssl({"x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key,
              "-CAcreateserial", "-out", cert.cert, "-days", "2", "-extfile", ext});
  return cert;
}

}  // namespace testing
}  // namespace gradsync
