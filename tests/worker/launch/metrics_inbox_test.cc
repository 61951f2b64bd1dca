#include "worker/launch/metrics_inbox.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/testing/eventually.h"

namespace gradsync {
namespace {

// Sends `bytes` as one datagram to the socket at `path`.
void Send(const std::string& path, const std::string& bytes) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  EXPECT_EQ(sendto(fd, bytes.data(), bytes.size(), 0,
                   reinterpret_cast<sockaddr*>(&address), sizeof(address)),
            static_cast<ssize_t>(bytes.size()));
  close(fd);
}

TEST(MetricsInboxTest, DeliversMessagesDropsGarbageAndCleansUp) {
  absl::Mutex mu;
  std::vector<v1::HeartbeatRequest> received;
  std::string path;
  {
    auto inbox = MetricsInbox::Open([&](const v1::HeartbeatRequest& m) {
      absl::MutexLock lock(&mu);
      received.push_back(m);
    });
    ASSERT_TRUE(inbox.ok()) << inbox.status();
    path = (*inbox)->path();
    v1::HeartbeatRequest message;
    message.mutable_member()->set_rank(3);
    message.mutable_member()->set_round(2);
    message.mutable_metrics()->set_step(17);
    Send(path, std::string("\xff\xff\xff", 3));  // not a message
    Send(path, "");  // an empty datagram does not stop it
    Send(path, message.SerializeAsString());
    ASSERT_TRUE(Eventually([&] {
      absl::MutexLock lock(&mu);
      return received.size() == 2;
    }));
    absl::MutexLock lock(&mu);
    ASSERT_EQ(received.size(), 2u);  // the empty one parses as empty
    EXPECT_EQ(received.back().member().rank(), 3);
    EXPECT_EQ(received.back().metrics().step(), 17);
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "socket left behind";
}

// A $TMPDIR too long for the socket's path (a batch scheduler's per-job
// directory) does not stop the inbox: it goes under /tmp instead; a short
// one is used.
TEST(MetricsInboxTest, ATmpdirTooLongForASocketFallsBackToTmp) {
  const char* before = getenv("TMPDIR");
  const std::string saved = before != nullptr ? before : "";
  std::string long_dir = "/tmp/gradsync-inbox-test-" + std::string(80, 'x') +
                         "-XXXXXX";
  ASSERT_NE(mkdtemp(long_dir.data()), nullptr) << strerror(errno);
  std::string short_dir = "/tmp/gradsync-inbox-XXXXXX";
  ASSERT_NE(mkdtemp(short_dir.data()), nullptr) << strerror(errno);
  const auto ignore = [](const v1::HeartbeatRequest&) {};
  setenv("TMPDIR", long_dir.c_str(), 1);
  auto fallen_back = MetricsInbox::Open(ignore);
  setenv("TMPDIR", short_dir.c_str(), 1);
  auto in_tmpdir = MetricsInbox::Open(ignore);
  if (before != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  ASSERT_TRUE(fallen_back.ok()) << fallen_back.status();
  EXPECT_EQ((*fallen_back)->dir().rfind("/tmp/gradsync-launch-", 0), 0u)
      << (*fallen_back)->dir();
  ASSERT_TRUE(in_tmpdir.ok()) << in_tmpdir.status();
  EXPECT_EQ((*in_tmpdir)->dir().rfind(short_dir + "/gradsync-launch-", 0), 0u)
      << (*in_tmpdir)->dir();
  fallen_back->reset();
  in_tmpdir->reset();
  EXPECT_EQ(rmdir(long_dir.c_str()), 0) << strerror(errno);
  EXPECT_EQ(rmdir(short_dir.c_str()), 0) << "the inbox left files behind";
}

}  // namespace
}  // namespace gradsync
