#include "worker/launch/output_pump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

std::string ReadAll(int fd) {
  std::string out;
  char buffer[256];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) {
    out.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// What `fd` delivers up to and including its first '\n', or what it
// delivered by `timeout` if no '\n' came by then.
std::string ReadLine(int fd, absl::Duration timeout) {
  std::string out;
  const absl::Time deadline = absl::Now() + timeout;
  char c;
  while (out.empty() || out.back() != '\n') {
    pollfd ready{fd, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(
        std::max(deadline - absl::Now(), absl::ZeroDuration())));
    if (poll(&ready, 1, ms) <= 0 || read(fd, &c, 1) != 1) break;
    out.push_back(c);
  }
  return out;
}

void Write(int fd, const std::string& text) {
  ASSERT_EQ(write(fd, text.data(), text.size()),
            static_cast<ssize_t>(text.size()));
}

TEST(OutputPumpTest, LinesArePrefixedOnTheConsoleAndKeptWholeInTheFile) {
  int source[2], console[2], file[2];
  ASSERT_EQ(pipe(source), 0);
  ASSERT_EQ(pipe(console), 0);
  ASSERT_EQ(pipe(file), 0);
  {
    OutputPump pump;
    pump.Add(source[0], OutputSink{"[rank3]: ", console[1], file[1]});
    Write(source[1], "one\ntw");
    Write(source[1], "o\nthree without end");
    close(source[1]);
    pump.Drain(absl::Seconds(30));
  }
  close(console[1]);
  EXPECT_EQ(ReadAll(console[0]),
            "[rank3]: one\n[rank3]: two\n[rank3]: three without end\n");
  EXPECT_EQ(ReadAll(file[0]), "one\ntwo\nthree without end");
}

// tqdm redraws its bar after a '\r' and never ends the line until it is
// done: each redraw reaches the console, prefixed, and stays on one terminal
// line. "\r\n" ends one line, not two. The file gets the bytes as they came.
TEST(OutputPumpTest, CarriageReturnsEndConsoleLinesToo) {
  int source[2], console[2], file[2];
  ASSERT_EQ(pipe(source), 0);
  ASSERT_EQ(pipe(console), 0);
  ASSERT_EQ(pipe(file), 0);
  const std::string bar = "\r 10%|#\r 50%|#####\r100%|##########\n";
  {
    OutputPump pump;
    pump.Add(source[0], OutputSink{"[rank0]: ", console[1], file[1]});
    Write(source[1], bar);
    Write(source[1], "dos\r");
    Write(source[1], "\nunix\n");
    close(source[1]);
    pump.Drain(absl::Seconds(30));
  }
  close(console[1]);
  EXPECT_EQ(ReadAll(console[0]),
            "[rank0]: \r[rank0]:  10%|#\r[rank0]:  50%|#####\r"
            "[rank0]: 100%|##########\n[rank0]: dos\r\n[rank0]: unix\n");
  EXPECT_EQ(ReadAll(file[0]), bar + "dos\r\nunix\n");
}

// Output that never ends its line is not held back until the stream ends:
// it reaches the console once it is kMaxLine long, as a line of its own.
TEST(OutputPumpTest, ALineReachesTheConsoleOnceItIsTooLongToHold) {
  int source[2], console[2];
  ASSERT_EQ(pipe(source), 0);
  ASSERT_EQ(pipe(console), 0);
  // Room for all the console gets: the pump never waits for this thread.
  ASSERT_GE(fcntl(console[1], F_SETPIPE_SZ, 1 << 20), 1 << 20);
  OutputPump pump;
  pump.Add(source[0], OutputSink{"[rank0]: ", console[1], -1});
  const std::string xs(OutputPump::kMaxLine + 1, 'x');
  Write(source[1], xs);
  // Bounds only a failure: the pump writes the line as soon as it read it.
  const std::string first = ReadLine(console[0], absl::Seconds(20));
  ASSERT_GE(first.size(), sizeof("[rank0]: ") - 1 + OutputPump::kMaxLine + 1)
      << "the console got " << first.size() << " bytes";
  const size_t held = first.size() - (sizeof("[rank0]: ") - 1) - 1;
  EXPECT_EQ(first, "[rank0]: " + xs.substr(0, held) + "\n");
  Write(source[1], "done\n");
  close(source[1]);
  pump.Drain(absl::Seconds(30));
  close(console[1]);
  EXPECT_EQ(ReadAll(console[0]), "[rank0]: " + xs.substr(held) + "done\n");
}

// `gradsync launch ... | tee log`, and tee is gone: writing to the console
// raises SIGPIPE, whose default action would end the launcher. It goes on,
// and the file still gets everything.
TEST(OutputPumpTest, AConsoleNobodyReadsIsNotTheLaunchersEnd) {
  signal(SIGPIPE, SIG_DFL);  // as in the launcher
  int source[2], console[2], file[2];
  ASSERT_EQ(pipe(source), 0);
  ASSERT_EQ(pipe(console), 0);
  ASSERT_EQ(pipe(file), 0);
  close(console[0]);
  {
    OutputPump pump;
    pump.Add(source[0], OutputSink{"[rank0]: ", console[1], file[1]});
    Write(source[1], "one\n");
    Write(source[1], "two\nthree");
    close(source[1]);
    pump.Drain(absl::Seconds(30));
  }
  close(console[1]);
  EXPECT_EQ(ReadAll(file[0]), "one\ntwo\nthree");
}

TEST(OutputPumpTest, DrainGivesUpOnAPipeThatStaysOpen) {
  int source[2];
  ASSERT_EQ(pipe(source), 0);
  OutputPump pump;
  pump.Add(source[0], OutputSink{"", -1, -1});
  const absl::Time start = absl::Now();
  pump.Drain(absl::Milliseconds(100));  // returns: the pipe was abandoned
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  close(source[1]);
}

}  // namespace
}  // namespace gradsync
