// MetricsInbox: where the node agent's processes send their own metrics
// (gradsync.torch.monitor(): steps, step times, per-bucket all-reduce times,
// collective fingerprints), which the agent folds into the heartbeats it
// sends for them. One heartbeat stream per member stays the agent's; a
// process only talks to its local agent, over a Unix datagram socket whose
// path it finds in GRADSYNC_AGENT_SOCKET.
#ifndef GRADSYNC_WORKER_LAUNCH_METRICS_INBOX_H_
#define GRADSYNC_WORKER_LAUNCH_METRICS_INBOX_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "proto/gradsync/v1/health.pb.h"

namespace gradsync {

// A datagram socket in a fresh private directory (under $TMPDIR, or /tmp
// where the socket's path under $TMPDIR would be too long for a Unix
// socket's 108 bytes); each datagram is one
// serialized v1::HeartbeatRequest (member.rank and member.round name the
// sender; metrics as in a heartbeat). One thread receives and hands each
// well-formed message to `on_message`; malformed ones are dropped.
// Destruction stops the thread and removes the socket and its directory.
class MetricsInbox {
 public:
  using Callback = std::function<void(const v1::HeartbeatRequest&)>;

  // INTERNAL when the directory or socket cannot be made.
  static absl::StatusOr<std::unique_ptr<MetricsInbox>> Open(Callback on_message);
  ~MetricsInbox();
  MetricsInbox(const MetricsInbox&) = delete;
  MetricsInbox& operator=(const MetricsInbox&) = delete;

  // The socket's path, for GRADSYNC_AGENT_SOCKET.
  const std::string& path() const { return path_; }
  // Its private directory (0700), where the agent keeps the processes'
  // stacks files too.
  const std::string& dir() const { return dir_; }

 private:
  MetricsInbox(int fd, std::string dir, std::string path, Callback on_message);
  void Run();

  const int fd_;
  const std::string dir_, path_;
  const Callback on_message_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_METRICS_INBOX_H_
