#include "server/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace gradsync {

namespace {

int HttpCode(const absl::Status& status) {
  if (absl::IsUnauthenticated(status)) return 401;
  if (absl::IsPermissionDenied(status)) return 403;
  if (absl::IsNotFound(status)) return 404;
  if (absl::IsInvalidArgument(status)) return 400;
  return 500;
}

}  // namespace

HttpServer::HttpServer(std::vector<HttpRoute> routes)
    : routes_(std::move(routes)) {}

HttpServer::~HttpServer() { Stop(); }

namespace {

// A plain or an HTTPS server with gradsync's threads and socket options.
absl::StatusOr<std::unique_ptr<httplib::Server>> MakeServer(
    const std::string& tls_cert, const std::string& tls_key) {
  std::unique_ptr<httplib::Server> server;
  if (tls_cert.empty()) {
    server = std::make_unique<httplib::Server>();
  } else {
    auto https = std::make_unique<httplib::SSLServer>(tls_cert.c_str(),
                                                      tls_key.c_str());
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot serve HTTPS with the certificate '", tls_cert,
          "' and key '", tls_key, "'"));
    }
    server = std::move(https);
  }
  // Scrapes are rare: two threads are plenty and leave the cores to gRPC.
  server->new_task_queue = [] { return new httplib::ThreadPool(2); };
  // cpp-httplib's default sets SO_REUSEPORT, which lets a second process
  // bind the same port and silently take half the scrapes. SO_REUSEADDR
  // alone still lets a restarted coordinator bind past TIME_WAIT.
  server->set_socket_options([](int socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  return server;
}

// Serves `route` on `server`: the render's body, or its error's HTTP code
// and message.
void AddRoute(const HttpRoute& route, httplib::Server* server) {
  server->Get(route.path, [&route](const httplib::Request& request,
                                   httplib::Response& response) {
    HttpRequest seen;
    seen.params.insert(request.params.begin(), request.params.end());
    std::string authorization;
    if (request.has_header("Authorization")) {
      authorization = request.get_header_value("Authorization");
      seen.authorization = &authorization;
    }
    absl::StatusOr<std::string> body = route.render(seen);
    if (body.ok()) {
      response.set_content(*std::move(body), route.content_type);
    } else {
      response.status = HttpCode(body.status());
      response.set_content(std::string(body.status().message()),
                           "text/plain; charset=utf-8");
    }
  });
}

}  // namespace

absl::Status HttpServer::Start(const std::string& address,
                               const std::string& tls_cert,
                               const std::string& tls_key) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address, "' is not HOST:PORT (e.g. 0.0.0.0:9400)"));
  }
  std::string host = address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  GS_ASSIGN_OR_RETURN(server_, MakeServer(tls_cert, tls_key));
  for (const HttpRoute& route : routes_) AddRoute(route, server_.get());
  const bool bound = port == 0 ? (port = server_->bind_to_any_port(host)) > 0
                               : server_->bind_to_port(host, port);
  if (!bound) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on '", address, "': the address is in use or not local"));
  }
  port_ = port;
  return Listen(address);
}

absl::Status HttpServer::Listen(const std::string& address) {
  listening_ended_.store(false);
  thread_ = std::thread([this, server = server_.get()] {
    server->listen_after_bind();
    listening_ended_.store(true);
  });
  // cpp-httplib's stop() does nothing until the listen loop runs (it checks
  // is_running()), and the loop then never ends: return only once it runs,
  // so that a Stop() right after Start() always stops it.
  for (absl::Duration pause = absl::Microseconds(50);
       !server_->is_running() && !listening_ended_.load();
       pause = std::min(2 * pause, absl::Milliseconds(5))) {
    absl::SleepFor(pause);
  }
  if (!server_->is_running()) {
    thread_.join();
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on '", address, "': the listen loop ended at once"));
  }
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace gradsync
