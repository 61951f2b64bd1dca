// Certificates for TLS tests, made with openssl (Debian's openssl, which the
// test command installs): a CA and certificates it signs for 127.0.0.1.
// Not thread-safe: one test thread makes them.
#ifndef GRADSYNC_TESTS_TESTING_TEST_PKI_H_
#define GRADSYNC_TESTS_TESTING_TEST_PKI_H_

#include <string>

namespace gradsync {
namespace testing {

// A CA's certificate and key, PEM files under TempPath.
struct TestCa {
  std::string cert;
  std::string key;
};

// A certificate and its key, PEM files under TempPath.
struct TestCert {
  std::string cert;
  std::string key;
};

// A self-signed CA called `name` (test failures on error).
TestCa MakeTestCa(const std::string& name);

// A certificate `name` signed by `ca`, valid for IP 127.0.0.1, usable by a
// server and a client.
TestCert MakeTestCert(const TestCa& ca, const std::string& name);

}  // namespace testing
}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_TEST_PKI_H_
