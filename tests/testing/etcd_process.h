// etcd-server (Debian's etcd-server package) as a one-member cluster on
// loopback ports for tests of the coordinator's --etcd storage.
#ifndef GRADSYNC_TESTS_TESTING_ETCD_PROCESS_H_
#define GRADSYNC_TESTS_TESTING_ETCD_PROCESS_H_

#include <memory>
#include <string>

#include "common/channel_credentials.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace gradsync {
namespace testing {

// Not thread-safe: one test thread drives it. The process is killed and
// reaped on destruction, and its data removed (etcd preallocates 64 MB of
// write-ahead log: ctest's temporary directories, unlike Bazel's, outlive
// the test); its log stays in the test's temporary directory.
class EtcdProcess {
 public:
  EtcdProcess() = default;
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;
  ~EtcdProcess();

  // Where the etcd binary is ($GRADSYNC_ETCD, else /usr/bin/etcd), or ""
  // when there is none (tests then skip).
  static std::string Binary();

  // TLS on the client API: etcd's certificate and key, and with a
  // `client_ca` its --client-cert-auth against that CA; `probe` is what the
  // start-up check connects with.
  struct Tls {
    std::string cert;
    std::string key;
    std::string client_ca;
    ClientTls probe;
  };

  // Starts a fresh member named `name` (with `tls`, when given, on its
  // client API) and waits (bounded) until it serves reads; tries again (3
  // times in all) with other ports when it does not start.
  ::testing::AssertionResult Start(const std::string& name,
                                   const Tls* tls = nullptr);

  // "127.0.0.1:PORT" of its client API once started.
  const std::string& endpoint() const { return endpoint_; }
  Child& child() { return *child_; }

 private:
  ::testing::AssertionResult StartOnce(const std::string& name, const Tls* tls);

  std::unique_ptr<Child> child_;  // killed and reaped when replaced or destroyed
  std::string endpoint_;
  std::string data_dir_;  // of the member started last
};

}  // namespace testing
}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_ETCD_PROCESS_H_
