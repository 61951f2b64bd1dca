#include "worker/launch/output_pump.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradsync {
namespace {

// Writes all of `size` bytes at `data` to `fd`; 0, or the errno of the
// write that failed (EPIPE: nothing reads `fd` anymore).
int WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

OutputPump::OutputPump() {
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
  thread_ = std::thread([this] { Run(); });
}

OutputPump::~OutputPump() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  thread_.join();
  for (Stream& stream : added_) Close(&stream);
  close(wake_[0]);
  close(wake_[1]);
}

void OutputPump::Add(int fd, OutputSink sink) {
  {
    absl::MutexLock lock(&mu_);
    added_.push_back(Stream{fd, std::move(sink), ""});
    ++open_;
  }
  Wake();
}

void OutputPump::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto all_closed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return open_ == 0;
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&all_closed), timeout)) return;
  abandon_ = true;
  Wake();
  mu_.Await(absl::Condition(&all_closed));
}

void OutputPump::Wake() {
  const char byte = 0;
  ssize_t ignored = write(wake_[1], &byte, 1);
  (void)ignored;
}

void OutputPump::Emit(Stream* stream, const char* data, size_t size) {
  if (stream->sink.file_fd >= 0) WriteAll(stream->sink.file_fd, data, size);
  if (stream->sink.console_fd < 0) return;
  // `partial` holds no line end: only the new bytes are scanned.
  const absl::string_view text(data, size);
  size_t start = 0;
  for (size_t end;
       (end = text.find_first_of("\r\n", start)) != absl::string_view::npos;
       start = end + 1) {
    const absl::string_view rest = text.substr(start, end - start);
    // "\r\n" ends one line: the '\n' after a '\r' is written alone.
    if (stream->partial.empty() && rest.empty() && stream->after_cr) {
      WriteConsole(stream, text.substr(end, 1));
    } else {
      WriteConsole(stream, absl::StrCat(stream->sink.prefix, stream->partial,
                                        rest, text.substr(end, 1)));
    }
    stream->partial.clear();
    stream->after_cr = text[end] == '\r';
  }
  stream->partial.append(data + start, size - start);
  if (start < size) stream->after_cr = false;
  if (stream->partial.size() >= kMaxLine) {
    WriteConsole(stream,
                 absl::StrCat(stream->sink.prefix, stream->partial, "\n"));
    stream->partial.clear();
  }
}

void OutputPump::WriteConsole(Stream* stream, absl::string_view line) {
  if (stream->sink.console_fd < 0) return;
  if (WriteAll(stream->sink.console_fd, line.data(), line.size()) == EPIPE) {
    // The console's reader is gone (`gradsync launch ... | tee` and tee
    // exited): not the job's failure. The file, if any, still gets it all.
    stream->sink.console_fd = -1;
  }
}

void OutputPump::Close(Stream* stream) {
  if (!stream->partial.empty()) {
    WriteConsole(stream,
                 absl::StrCat(stream->sink.prefix, stream->partial, "\n"));
  }
  close(stream->fd);
  if (stream->sink.file_fd >= 0) close(stream->sink.file_fd);
}

bool OutputPump::Pump(Stream* stream) {
  char buffer[1 << 16];
  const ssize_t n = read(stream->fd, buffer, sizeof(buffer));
  if (n > 0) {
    Emit(stream, buffer, static_cast<size_t>(n));
    return true;
  }
  return n < 0 && errno == EINTR;
}

void OutputPump::Run() {
  // A console nobody reads anymore makes write() fail with EPIPE here
  // instead of raising SIGPIPE, whose default action would end the whole
  // launcher. Only this thread blocks it: the processes the launcher starts
  // must get SIGPIPE's default (SIG_IGN would be inherited through exec).
  // The SIGPIPE such a write raises stays pending on this thread, harmless.
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  std::vector<Stream> streams;
  std::vector<pollfd> fds;
  while (true) {
    bool abandon = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        for (Stream& stream : streams) Close(&stream);
        return;
      }
      for (Stream& stream : added_) streams.push_back(std::move(stream));
      added_.clear();
      abandon = abandon_;
      abandon_ = false;
    }
    int ended = 0;
    if (abandon) {
      for (Stream& stream : streams) Close(&stream);
      ended = static_cast<int>(streams.size());
      streams.clear();
    } else {
      fds.assign(1, pollfd{wake_[0], POLLIN, 0});
      for (const Stream& stream : streams) {
        fds.push_back(pollfd{stream.fd, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
      if (fds[0].revents != 0) {
        char drain[64];
        while (read(wake_[0], drain, sizeof(drain)) > 0) {
        }
      }
      std::vector<Stream> still_open;
      for (size_t i = 0; i < streams.size(); ++i) {
        if (fds[i + 1].revents == 0 || Pump(&streams[i])) {
          still_open.push_back(std::move(streams[i]));
        } else {
          Close(&streams[i]);
          ++ended;
        }
      }
      streams = std::move(still_open);
    }
    if (ended > 0) {
      absl::MutexLock lock(&mu_);
      open_ -= ended;
    }
  }
}

}  // namespace gradsync
