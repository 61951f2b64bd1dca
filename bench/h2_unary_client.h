// A lean gRPC load generator: unary calls as plain HTTP/2 (nghttp2), many
// streams on a few connections, driven by one thread.
//
// Why not gRPC's C++ client: simulating 100,000 workers in one process with
// it costs the benchmark about 75 us of CPU per call (call objects, its own
// completion-queue bookkeeping, several threads waking each other), which on
// a 2-core machine is CPU taken from the coordinator being measured; a
// worker on its own node pays that on its own cores. This client puts the
// same bytes on the wire (the same HTTP/2 requests, headers and gRPC-framed
// messages as gRPC's client sends, over a few shared connections) for a few
// microseconds per call, so the coordinator's cost is what is timed.
//
// Plain text only (no TLS); the peer must be a gRPC server.
#ifndef GRADSYNC_BENCH_H2_UNARY_CLIENT_H_
#define GRADSYNC_BENCH_H2_UNARY_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradsync {

// Connections to one gRPC server and the unary calls run on them.
//
// Thread-compatible: one thread at a time. Lifetime: Connect(), any number
// of Run()s, destroy (closes the connections).
class H2UnaryClient {
 public:
  // One unary call: what to send, and (filled in by Run()) what came back.
  struct Call {
    std::string path;     // "/package.Service/Method"
    std::string request;  // the serialized request message
    std::vector<std::pair<std::string, std::string>> metadata;

    absl::Time sent;      // when Run() started (every call starts at once)
    absl::Time received;  // when the call ended
    // The gRPC status code (-1: the call never ended) and message.
    int code = -1;
    std::string message;
    std::string response;  // the serialized response message
  };

  // Opens `connections` HTTP/2 connections to `target` ("HOST:PORT") and
  // waits, at most `timeout`, until the server's settings arrived on each.
  static absl::StatusOr<std::unique_ptr<H2UnaryClient>> Connect(
      const std::string& target, int connections, absl::Duration timeout);

  ~H2UnaryClient();
  H2UnaryClient(const H2UnaryClient&) = delete;
  H2UnaryClient& operator=(const H2UnaryClient&) = delete;

  // Starts every call of `calls` at once (call i on connection i modulo the
  // connections) and runs until each has ended. DEADLINE_EXCEEDED when some
  // had not after `timeout` (they keep code -1); UNAVAILABLE when a
  // connection failed (the calls still open end with code 14,
  // UNAVAILABLE); the error when a call cannot be sent (the calls not sent
  // keep code -1). After any of these, the connections may still carry
  // calls: a later Run() is FAILED_PRECONDITION (connect again).
  absl::Status Run(std::vector<Call>* calls, absl::Duration timeout);

 private:
  class Connection;
  explicit H2UnaryClient(std::vector<std::unique_ptr<Connection>> connections);
  // Sends and receives on every connection until `done()` or `deadline`.
  absl::Status Pump(absl::Time deadline, const std::function<bool()>& done);

  std::vector<std::unique_ptr<Connection>> connections_;
  bool spent_ = false;  // a Run() failed
};

}  // namespace gradsync

#endif  // GRADSYNC_BENCH_H2_UNARY_CLIENT_H_
