// Copies the output of the node agent's processes, line by line, to the
// agent's own stdout/stderr with a "[rankN]: " prefix, and/or to log files.
#ifndef GRADSYNC_WORKER_LAUNCH_OUTPUT_PUMP_H_
#define GRADSYNC_WORKER_LAUNCH_OUTPUT_PUMP_H_

#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

// Where one pipe's lines go.
struct OutputSink {
  std::string prefix;    // put before each line on the console
  int console_fd = -1;   // not owned; -1: not to the console
  int file_fd = -1;      // owned (closed at end of file); -1: no file
};

// One thread polls every pipe added. On the console a line ends at '\n' or
// '\r' (a progress bar's redraw: it stays on one terminal line, prefixed), or
// once it is kMaxLine long; it goes in one write(), so lines of different
// processes never interleave mid-line. The file gets the bytes as they come.
// A console that nobody reads anymore (EPIPE) is no longer written to.
// Thread-safe. The destructor stops the thread and closes what is open.
class OutputPump {
 public:
  // A console line longer than this (bytes) is written once it reaches it,
  // ended with a newline, and the rest follows on the next line.
  static constexpr size_t kMaxLine = 64 * 1024;

  OutputPump();
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // Takes `fd` (a pipe's read end) and copies what it delivers to `sink`
  // until end of file.
  void Add(int fd, OutputSink sink);

  // Blocks until every pipe added so far reached end of file, at most
  // `timeout`; then closes the rest (a process left a child that holds its
  // pipe open). Used after the processes exited.
  void Drain(absl::Duration timeout);

 private:
  struct Stream {
    int fd;
    OutputSink sink;
    std::string partial;  // a line not yet ended (no '\r' or '\n' in it)
    // The stream's last byte was a '\r' that ended a console line.
    bool after_cr = false;
  };
  void Run();
  void Wake();
  // Reads what `stream` has; false at end of file (then it is closed).
  bool Pump(Stream* stream);
  // Copies `size` bytes at `data` from `stream` to its sink.
  static void Emit(Stream* stream, const char* data, size_t size);
  // Writes `line` to the stream's console; stops writing to it on EPIPE.
  static void WriteConsole(Stream* stream, absl::string_view line);
  // Writes out what is left of `stream`'s line and closes its descriptors.
  static void Close(Stream* stream);

  int wake_[2] = {-1, -1};
  absl::Mutex mu_;
  std::vector<Stream> added_ ABSL_GUARDED_BY(mu_);  // not yet polled
  int open_ ABSL_GUARDED_BY(mu_) = 0;  // streams not at end of file
  bool abandon_ ABSL_GUARDED_BY(mu_) = false;  // close all open streams
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_LAUNCH_OUTPUT_PUMP_H_
