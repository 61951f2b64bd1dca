#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradsync {
namespace {

std::atomic<LogSeverity> min_severity{LogSeverity::kInfo};

char SeverityLetter(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kInfo:
      return 'I';
    case LogSeverity::kWarning:
      return 'W';
    case LogSeverity::kError:
      return 'E';
    case LogSeverity::kFatal:
      return 'F';
  }
  return '?';
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash == nullptr ? path : slash + 1;
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) { min_severity.store(severity); }

bool LogEnabled(LogSeverity severity) {
  return severity >= min_severity.load(std::memory_order_relaxed) ||
         severity == LogSeverity::kFatal;
}

namespace logging_internal {

LogMessage::LogMessage(LogSeverity severity, const char* file, int line)
    : severity_(severity) {
  stream_ << SeverityLetter(severity)
          << absl::FormatTime("%m%d %H:%M:%E6S", absl::Now(),
                              absl::LocalTimeZone())
          << ' ' << Basename(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  if (severity_ >= min_severity.load() || severity_ == LogSeverity::kFatal) {
    std::string line = stream_.str();
    line.push_back('\n');
    // One write(2) per line keeps lines from concurrent threads whole.
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace logging_internal
}  // namespace gradsync
