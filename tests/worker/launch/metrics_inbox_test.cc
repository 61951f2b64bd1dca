#include "worker/launch/metrics_inbox.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

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

}  // namespace
}  // namespace gradsync
