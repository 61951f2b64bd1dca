#include "worker/launch/metrics_inbox.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// Datagrams up to this size are read whole (a heartbeat's metrics with 256
// fingerprints fit many times over).
constexpr size_t kMaxDatagram = 1 << 20;
// The empty datagram the destructor sends to wake the receiving thread.
constexpr char kStop[] = "";

sockaddr_un Address(const std::string& path) {
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  return address;
}

constexpr char kDirTemplate[] = "/gradsync-launch-XXXXXX";
constexpr char kSocketName[] = "/agent.sock";

// Where the private directory goes: $TMPDIR, unless the socket's path there
// would not fit a sockaddr_un (a batch scheduler's long per-job TMPDIR),
// then /tmp.
std::string BaseDir() {
  const char* tmp = getenv("TMPDIR");
  if (tmp == nullptr || *tmp == '\0') return "/tmp";
  const size_t path_size =
      strlen(tmp) + strlen(kDirTemplate) + strlen(kSocketName);
  if (path_size >= sizeof(sockaddr_un{}.sun_path)) return "/tmp";
  return tmp;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsInbox>> MetricsInbox::Open(
    Callback on_message) {
  std::string dir = absl::StrCat(BaseDir(), kDirTemplate);
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create ", dir, ": ", strerror(errno)));
  }
  const std::string path = absl::StrCat(dir, kSocketName);
  const sockaddr_un address = Address(path);
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || path.size() >= sizeof(address.sun_path) ||
      bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) !=
          0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    rmdir(dir.c_str());
    return absl::InternalError(absl::StrCat("cannot bind the agent socket ",
                                            path, ": ", strerror(error)));
  }
  return std::unique_ptr<MetricsInbox>(
      new MetricsInbox(fd, std::move(dir), path, std::move(on_message)));
}

MetricsInbox::MetricsInbox(int fd, std::string dir, std::string path,
                           Callback on_message)
    : fd_(fd),
      dir_(std::move(dir)),
      path_(std::move(path)),
      on_message_(std::move(on_message)) {
  thread_ = std::thread([this] { Run(); });
}

MetricsInbox::~MetricsInbox() {
  stopping_ = true;
  const int waker = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const sockaddr_un address = Address(path_);
  sendto(waker, kStop, 0, 0, reinterpret_cast<const sockaddr*>(&address),
         sizeof(address));
  close(waker);
  thread_.join();
  close(fd_);
  unlink(path_.c_str());
  rmdir(dir_.c_str());
}

void MetricsInbox::Run() {
  std::vector<char> buffer(kMaxDatagram);
  while (true) {
    const ssize_t n = recv(fd_, buffer.data(), buffer.size(), 0);
    if (stopping_) return;  // woken by the destructor
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    v1::HeartbeatRequest message;
    if (message.ParseFromArray(buffer.data(), static_cast<int>(n))) {
      on_message_(message);
    }
  }
}

}  // namespace gradsync
