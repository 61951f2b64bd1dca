// Serves the coordinator's Prometheus metrics over HTTP (GET /metrics),
// with Debian's cpp-httplib.
#ifndef GRADSYNC_SERVER_METRICS_HTTP_SERVER_H_
#define GRADSYNC_SERVER_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace httplib {
class Server;
}

namespace gradsync {

// Lifetime: construct, Start() once, Stop() (or destroy). `render` runs on
// the server's threads, one scrape at a time per thread; it must be
// thread-safe and outlive the server.
class MetricsHttpServer {
 public:
  explicit MetricsHttpServer(std::function<std::string()> render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Listens on `address` ("HOST:PORT"; port 0 picks a free one); returns
  // once the listen loop runs, so Stop() may follow at once.
  // INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot be
  // bound.
  absl::Status Start(const std::string& address);

  // The bound port (valid after Start()).
  int port() const { return port_; }

  // Stops serving and joins the server thread. Idempotent.
  void Stop();

 private:
  std::function<std::string()> render_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listening_ended_{false};  // set by thread_ on its way out
  int port_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_METRICS_HTTP_SERVER_H_
