// The coordinator's HTTP port (--metrics_listen), with Debian's
// cpp-httplib: GET routes such as the Prometheus metrics (/metrics), the
// status page (/) and its JSON (/api/...).
#ifndef GRADSYNC_SERVER_HTTP_HTTP_SERVER_H_
#define GRADSYNC_SERVER_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace gradsync {

// What a route sees of a GET request.
struct HttpRequest {
  std::map<std::string, std::string> params;  // the query's
  // The Authorization header's value; nullptr when absent.
  const std::string* authorization = nullptr;
};

// One GET route: `render` returns the body, or an error: UNAUTHENTICATED is
// answered 401, PERMISSION_DENIED 403, NOT_FOUND 404, INVALID_ARGUMENT 400,
// others 500, with the message as a plain-text body.
struct HttpRoute {
  std::string path;
  std::string content_type;
  std::function<absl::StatusOr<std::string>(const HttpRequest& request)> render;
};

// Lifetime: construct, Start() once, Stop() (or destroy). The routes'
// `render` run on the server's threads, one request at a time per thread;
// they must be thread-safe and outlive the server.
class HttpServer {
 public:
  explicit HttpServer(std::vector<HttpRoute> routes);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Listens on `address` ("HOST:PORT"; port 0 picks a free one), over TLS
  // with the PEM certificate chain and key in the files `tls_cert` and
  // `tls_key` when given (HTTPS); returns once the listen loop runs, so
  // Stop() may follow at once. INVALID_ARGUMENT for a malformed address or a
  // certificate or key that cannot be loaded, UNAVAILABLE when the address
  // cannot be bound.
  absl::Status Start(const std::string& address, const std::string& tls_cert = "",
                     const std::string& tls_key = "");

  // The bound port (valid after Start()).
  int port() const { return port_; }

  // Stops serving and joins the server thread. Idempotent.
  void Stop();

 private:
  // Runs the listen loop of the bound server_ on thread_; returns once it
  // runs (UNAVAILABLE naming `address` when it ended at once).
  absl::Status Listen(const std::string& address);

  const std::vector<HttpRoute> routes_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listening_ended_{false};  // set by thread_ on its way out
  int port_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HTTP_HTTP_SERVER_H_
