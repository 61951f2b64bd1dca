#include "tests/testing/etcd_process.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/storage/etcd_storage.h"
#include "tests/testing/ports.h"

namespace gradsync {
namespace testing {

std::string EtcdProcess::Binary() {
  const char* env = std::getenv("GRADSYNC_ETCD");
  const std::string path = env != nullptr ? env : "/usr/bin/etcd";
  return access(path.c_str(), X_OK) == 0 ? path : std::string();
}

EtcdProcess::~EtcdProcess() {
  child_.reset();  // killed and reaped first
  if (data_dir_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(data_dir_, ignored);
}

::testing::AssertionResult EtcdProcess::Start(const std::string& name,
                                              const Tls* tls) {
  // A port picked free may be taken before etcd binds it: try again then.
  constexpr int kAttempts = 3;
  ::testing::AssertionResult started = ::testing::AssertionFailure();
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    started = StartOnce(name, tls);
    if (started) break;
  }
  return started;
}

::testing::AssertionResult EtcdProcess::StartOnce(const std::string& name,
                                                  const Tls* tls) {
  const std::string binary = Binary();
  if (binary.empty()) {
    return ::testing::AssertionFailure() << "no etcd binary (etcd-server)";
  }
  const std::string dir = TempPath(absl::StrCat("etcd-", name));
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  std::filesystem::create_directories(dir, ignored);
  data_dir_ = absl::StrCat(dir, "/data");
  const int client_port = PickUnusedPort();
  const int peer_port = PickUnusedPort();
  endpoint_ = absl::StrCat("127.0.0.1:", client_port);
  const std::string client_url =
      absl::StrCat(tls != nullptr ? "https://" : "http://", endpoint_);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port);
  std::vector<std::string> argv = {
      binary, absl::StrCat("--name=", name),
      absl::StrCat("--data-dir=", data_dir_),
      absl::StrCat("--listen-client-urls=", client_url),
      absl::StrCat("--advertise-client-urls=", client_url),
      absl::StrCat("--listen-peer-urls=", peer_url),
      absl::StrCat("--initial-advertise-peer-urls=", peer_url),
      absl::StrCat("--initial-cluster=", name, "=", peer_url), "--logger=zap",
      absl::StrCat("--log-outputs=", dir, "/etcd.log")};
  if (tls != nullptr) {
    argv.push_back(absl::StrCat("--cert-file=", tls->cert));
    argv.push_back(absl::StrCat("--key-file=", tls->key));
    if (!tls->client_ca.empty()) {
      argv.push_back(absl::StrCat("--trusted-ca-file=", tls->client_ca));
      argv.push_back("--client-cert-auth");
    }
  }
  child_ = std::make_unique<Child>();
  if (!child_->Start(argv, /*capture=*/false)) {
    return ::testing::AssertionFailure() << "cannot start " << binary;
  }
  // Serving once a read through the client answers; etcd elects itself
  // leader within about a second.
  constexpr absl::Duration kStartBound = absl::Seconds(30);
  const absl::Time deadline = absl::Now() + kStartBound;
  absl::Status last;
  while (absl::Now() < deadline) {
    if (child_->Reap()) {
      return ::testing::AssertionFailure()
             << "etcd exited at start (log: " << dir << "/etcd.log): "
             << child_->describe();
    }
    EtcdOptions options;
    options.endpoints = {endpoint_};
    options.call_timeout = absl::Seconds(1);
    if (tls != nullptr) options.tls = tls->probe;
    absl::StatusOr<std::unique_ptr<EtcdStorage>> probe =
        EtcdStorage::Open(options);
    if (probe.ok()) return ::testing::AssertionSuccess();
    last = probe.status();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return ::testing::AssertionFailure()
         << "etcd did not serve within " << absl::FormatDuration(kStartBound)
         << ": " << last;
}

}  // namespace testing
}  // namespace gradsync
