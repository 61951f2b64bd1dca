#include "bench/h2_unary_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

constexpr int kUnavailable = 14;  // grpc::StatusCode::UNAVAILABLE
constexpr int kInternal = 13;     // grpc::StatusCode::INTERNAL
// Bytes gathered from the session before one write to the socket.
constexpr size_t kWriteChunk = 64 << 10;

absl::string_view View(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

// A socket connected to HOST:PORT, with Nagle off and then non-blocking.
absl::StatusOr<int> ConnectSocket(const std::string& host,
                                  const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  int error = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      error = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to ", host, ":", port, ": ", std::strerror(error)));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

}  // namespace

// One HTTP/2 connection and the calls of the current Run() on it.
class H2UnaryClient::Connection {
 public:
  static absl::StatusOr<std::unique_ptr<Connection>> Open(
      const std::string& host, const std::string& port) {
    GS_ASSIGN_OR_RETURN(int fd, ConnectSocket(host, port));
    auto connection = std::unique_ptr<Connection>(
        new Connection(fd, absl::StrCat(host, ":", port)));
    GS_RETURN_IF_ERROR(connection->StartSession());
    return connection;
  }

  ~Connection() {
    if (session_ != nullptr) nghttp2_session_del(session_);
    close(fd_);
  }

  int fd() const { return fd_; }
  bool settings_received() const { return settings_received_; }
  size_t ended() const { return ended_; }
  bool WantsWrite() const {
    return out_offset_ < out_.size() || nghttp2_session_want_write(session_);
  }

  // Queues `call` as a new stream; it is sent by Flush().
  absl::Status Submit(Call* call) {
    auto& stream = streams_.emplace_back();
    stream.call = call;
    const uint32_t size = call->request.size();
    const char prefix[5] = {0, static_cast<char>(size >> 24),
                            static_cast<char>(size >> 16),
                            static_cast<char>(size >> 8),
                            static_cast<char>(size)};
    stream.framed_request.assign(prefix, sizeof(prefix));
    stream.framed_request += call->request;
    std::vector<nghttp2_nv> headers = {
        Header(":method", "POST"),
        Header(":scheme", "http"),
        Header(":path", call->path),
        Header(":authority", authority_),
        Header("te", "trailers"),
        Header("content-type", "application/grpc"),
        Header("user-agent", "gradsync-bench-h2"),
    };
    for (const auto& [key, value] : call->metadata) {
      headers.push_back(Header(key, value));
    }
    nghttp2_data_provider body;
    body.source.ptr = &stream;
    body.read_callback = &Connection::ReadBody;
    if (int32_t id = nghttp2_submit_request(session_, nullptr, headers.data(),
                                            headers.size(), &body, &stream);
        id < 0) {
      return absl::InternalError(
          absl::StrCat("cannot submit a request: ", nghttp2_strerror(id)));
    }
    return absl::OkStatus();
  }

  // Writes what the session has to send, as far as the socket takes it.
  absl::Status Flush() {
    for (;;) {
      if (out_offset_ == out_.size()) {
        out_.clear();
        out_offset_ = 0;
        while (out_.size() < kWriteChunk) {
          const uint8_t* data = nullptr;
          ssize_t n = nghttp2_session_mem_send(session_, &data);
          if (n < 0) return SessionError("send", n);
          if (n == 0) break;
          out_.append(reinterpret_cast<const char*>(data), n);
        }
        if (out_.empty()) return absl::OkStatus();
      }
      ssize_t written = send(fd_, out_.data() + out_offset_,
                             out_.size() - out_offset_, MSG_NOSIGNAL);
      if (written < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
        return absl::UnavailableError(
            absl::StrCat("write to ", authority_, ": ", std::strerror(errno)));
      }
      out_offset_ += written;
    }
  }

  // Reads what arrived and hands it to the session.
  absl::Status Read() {
    char buffer[64 << 10];
    for (;;) {
      ssize_t got = recv(fd_, buffer, sizeof(buffer), 0);
      if (got == 0) {
        return absl::UnavailableError(
            absl::StrCat(authority_, " closed the connection"));
      }
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
        return absl::UnavailableError(
            absl::StrCat("read from ", authority_, ": ", std::strerror(errno)));
      }
      ssize_t used = nghttp2_session_mem_recv(
          session_, reinterpret_cast<const uint8_t*>(buffer), got);
      if (used < 0) return SessionError("receive", used);
    }
  }

  // Ends every call still open with UNAVAILABLE: `why`.
  void FailOpen(absl::string_view why) {
    for (Stream& stream : streams_) {
      if (stream.ended) continue;
      stream.call->code = kUnavailable;
      stream.call->message = std::string(why);
      stream.call->received = absl::Now();
      stream.ended = true;
      ++ended_;
    }
  }

  // Forgets the calls of the previous Run(), all of which ended.
  void Reset() {
    streams_.clear();
    ended_ = 0;
  }

 private:
  struct Stream {
    Call* call = nullptr;
    std::string framed_request;  // the gRPC frame: 5-byte prefix, message
    size_t sent = 0;             // bytes of framed_request sent
    std::string framed_response;
    bool ended = false;
  };

  Connection(int fd, std::string authority)
      : fd_(fd), authority_(std::move(authority)) {}

  static nghttp2_nv Header(absl::string_view name, absl::string_view value) {
    return nghttp2_nv{
        reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
        reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())),
        name.size(), value.size(), NGHTTP2_NV_FLAG_NONE};
  }

  absl::Status SessionError(absl::string_view what, ssize_t code) const {
    return absl::InternalError(absl::StrCat("HTTP/2 ", what, " on ",
                                            authority_, ": ",
                                            nghttp2_strerror(code)));
  }

  // A client session with large receive windows (answers never wait for
  // window updates), as gRPC's client asks for with its BDP probing.
  absl::Status StartSession() {
    nghttp2_session_callbacks* callbacks = nullptr;
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks,
                                                         &OnFrame);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, &OnHeader);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks,
                                                              &OnData);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks,
                                                           &OnClose);
    int rc = nghttp2_session_client_new(&session_, callbacks, this);
    nghttp2_session_callbacks_del(callbacks);
    if (rc != 0) return SessionError("session", rc);
    const nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 24},
    };
    rc = nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings,
                                 sizeof(settings) / sizeof(settings[0]));
    if (rc == 0) {
      rc = nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE,
                                                 0, 1 << 30);
    }
    return rc == 0 ? absl::OkStatus() : SessionError("settings", rc);
  }

  static Stream* StreamOf(nghttp2_session* session, int32_t id) {
    return static_cast<Stream*>(
        nghttp2_session_get_stream_user_data(session, id));
  }

  static ssize_t ReadBody(nghttp2_session*, int32_t, uint8_t* buffer,
                          size_t length, uint32_t* flags,
                          nghttp2_data_source* source, void*) {
    auto* stream = static_cast<Stream*>(source->ptr);
    const size_t n =
        std::min(length, stream->framed_request.size() - stream->sent);
    std::memcpy(buffer, stream->framed_request.data() + stream->sent, n);
    stream->sent += n;
    if (stream->sent == stream->framed_request.size()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return n;
  }

  static int OnFrame(nghttp2_session*, const nghttp2_frame* frame,
                     void* self) {
    if (frame->hd.type == NGHTTP2_SETTINGS &&
        (frame->hd.flags & NGHTTP2_FLAG_ACK) == 0) {
      static_cast<Connection*>(self)->settings_received_ = true;
    }
    return 0;
  }

  static int OnHeader(nghttp2_session* session, const nghttp2_frame* frame,
                      const uint8_t* name, size_t name_size,
                      const uint8_t* value, size_t value_size, uint8_t,
                      void*) {
    Stream* stream = StreamOf(session, frame->hd.stream_id);
    if (stream == nullptr || frame->hd.type != NGHTTP2_HEADERS) return 0;
    const absl::string_view key = View(name, name_size);
    const absl::string_view text = View(value, value_size);
    if (key == "grpc-status") {
      if (!absl::SimpleAtoi(text, &stream->call->code)) {
        stream->call->code = kInternal;
      }
    } else if (key == "grpc-message") {
      stream->call->message = std::string(text);
    } else if (key == ":status" && text != "200") {
      stream->call->message = absl::StrCat("HTTP status ", text);
    }
    return 0;
  }

  static int OnData(nghttp2_session* session, uint8_t, int32_t id,
                    const uint8_t* data, size_t size, void*) {
    if (Stream* stream = StreamOf(session, id)) {
      stream->framed_response.append(View(data, size).data(), size);
    }
    return 0;
  }

  static int OnClose(nghttp2_session* session, int32_t id,
                     uint32_t error_code, void* self) {
    Stream* stream = StreamOf(session, id);
    if (stream == nullptr || stream->ended) return 0;
    Call* call = stream->call;
    call->received = absl::Now();
    if (call->code < 0) {
      call->code = error_code != 0 ? kUnavailable : kInternal;
      if (call->message.empty()) {
        call->message = error_code != 0
                            ? absl::StrCat("stream reset: ",
                                           nghttp2_http2_strerror(error_code))
                            : "the answer carried no grpc-status";
      }
    }
    Unframe(stream->framed_response, call);
    stream->ended = true;
    ++static_cast<Connection*>(self)->ended_;
    return 0;
  }

  // The message of a gRPC frame (an uncompressed one; the benchmark asks
  // for no compression); an answer of another shape is INTERNAL.
  static void Unframe(const std::string& framed, Call* call) {
    if (framed.empty()) return;  // an error carries no message
    const auto* bytes = reinterpret_cast<const uint8_t*>(framed.data());
    const size_t size = framed.size() < 5
                            ? 0
                            : (size_t{bytes[1]} << 24) | (bytes[2] << 16) |
                                  (bytes[3] << 8) | bytes[4];
    if (framed.size() < 5 || bytes[0] != 0 || framed.size() != 5 + size) {
      call->code = kInternal;
      call->message = "the answer is not one uncompressed gRPC message";
      return;
    }
    call->response = framed.substr(5);
  }

  const int fd_;
  const std::string authority_;
  nghttp2_session* session_ = nullptr;
  bool settings_received_ = false;
  // Bytes taken from the session, written up to out_offset_.
  std::string out_;
  size_t out_offset_ = 0;
  // The calls of the current Run(); a deque keeps their addresses, which
  // the session holds until the connection is destroyed (the session
  // first: it calls nothing back as it goes).
  std::deque<Stream> streams_;
  size_t ended_ = 0;
};

absl::StatusOr<std::unique_ptr<H2UnaryClient>> H2UnaryClient::Connect(
    const std::string& target, int connections, absl::Duration timeout) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || connections < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need HOST:PORT and at least one connection, got '", target, "' and ",
        connections));
  }
  std::vector<std::unique_ptr<Connection>> opened;
  for (int i = 0; i < connections; ++i) {
    GS_ASSIGN_OR_RETURN(auto connection,
                        Connection::Open(target.substr(0, colon),
                                         target.substr(colon + 1)));
    opened.push_back(std::move(connection));
  }
  auto client =
      std::unique_ptr<H2UnaryClient>(new H2UnaryClient(std::move(opened)));
  absl::Status ready =
      client->Pump(absl::Now() + timeout, [c = client.get()] {
        for (const auto& connection : c->connections_) {
          if (!connection->settings_received()) return false;
        }
        return true;
      });
  if (!ready.ok()) return ready;
  return client;
}

H2UnaryClient::H2UnaryClient(
    std::vector<std::unique_ptr<Connection>> connections)
    : connections_(std::move(connections)) {}

H2UnaryClient::~H2UnaryClient() = default;

absl::Status H2UnaryClient::Run(std::vector<Call>* calls,
                                absl::Duration timeout) {
  if (spent_) {
    return absl::FailedPreconditionError(
        "a previous run of calls failed or timed out on these connections");
  }
  const absl::Time start = absl::Now();
  for (auto& connection : connections_) connection->Reset();
  for (size_t i = 0; i < calls->size(); ++i) {
    Call& call = (*calls)[i];
    call.sent = start;
    call.code = -1;
    absl::Status submitted =
        connections_[i % connections_.size()]->Submit(&call);
    if (!submitted.ok()) {
      spent_ = true;  // the session may hold calls submitted before
      return submitted;
    }
  }
  absl::Status status = Pump(start + timeout, [&] {
    size_t ended = 0;
    for (const auto& connection : connections_) ended += connection->ended();
    return ended == calls->size();
  });
  if (!status.ok()) spent_ = true;
  if (!status.ok() && !absl::IsDeadlineExceeded(status)) {
    for (auto& connection : connections_) connection->FailOpen(status.message());
  }
  return status;
}

absl::Status H2UnaryClient::Pump(absl::Time deadline,
                                 const std::function<bool()>& done) {
  std::vector<pollfd> polled(connections_.size());
  for (;;) {
    for (auto& connection : connections_) {
      GS_RETURN_IF_ERROR(connection->Flush());
    }
    if (done()) return absl::OkStatus();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("the calls did not end in time");
    }
    for (size_t i = 0; i < connections_.size(); ++i) {
      polled[i] = {connections_[i]->fd(),
                   static_cast<short>(
                       POLLIN | (connections_[i]->WantsWrite() ? POLLOUT : 0)),
                   0};
    }
    const int wait_ms = static_cast<int>(absl::ToInt64Milliseconds(
        std::min(left, absl::Milliseconds(100)))) + 1;
    if (poll(polled.data(), polled.size(), wait_ms) < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    for (size_t i = 0; i < connections_.size(); ++i) {
      if (polled[i].revents & (POLLIN | POLLERR | POLLHUP)) {
        GS_RETURN_IF_ERROR(connections_[i]->Read());
      }
    }
  }
}

}  // namespace gradsync
