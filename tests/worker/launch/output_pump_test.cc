#include "worker/launch/output_pump.h"

#include <fcntl.h>
#include <unistd.h>

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
