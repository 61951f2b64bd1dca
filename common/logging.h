// gradsync's one logging facility: line-oriented messages on stderr.
//
//   GS_LOG(INFO) << "job " << id << " round " << round << " closed";
//   GS_CHECK(ptr != nullptr) << "why this cannot happen";
//
// Each message becomes one line: "I1121 07:03:13.123456 file.cc:42] text".
// Thread-safe: a line is written with a single write(2). GS_LOG(FATAL) and a
// failed GS_CHECK abort the process; use GS_CHECK only for true invariants,
// never for input or environment errors (return absl::Status instead).
#ifndef GRADSYNC_COMMON_LOGGING_H_
#define GRADSYNC_COMMON_LOGGING_H_

#include <sstream>

namespace gradsync {

enum class LogSeverity { kInfo, kWarning, kError, kFatal };

// Sets the lowest severity that is printed (default kInfo). Thread-safe.
void SetMinLogSeverity(LogSeverity severity);
// Whether a message of `severity` is printed (FATAL always is). Messages
// that are not are never formatted.
bool LogEnabled(LogSeverity severity);

namespace logging_internal {

// Collects one message and writes it when destroyed.
class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & stream` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace gradsync

#define GS_LOG_SEVERITY_INFO ::gradsync::LogSeverity::kInfo
#define GS_LOG_SEVERITY_WARNING ::gradsync::LogSeverity::kWarning
#define GS_LOG_SEVERITY_ERROR ::gradsync::LogSeverity::kError
#define GS_LOG_SEVERITY_FATAL ::gradsync::LogSeverity::kFatal

// The stream of one message (internal: use GS_LOG).
#define GS_LOG_STREAM(severity)                                            \
  ::gradsync::logging_internal::LogMessage(GS_LOG_SEVERITY_##severity,     \
                                           __FILE__, __LINE__)             \
      .stream()

#define GS_LOG(severity)                                                   \
  !::gradsync::LogEnabled(GS_LOG_SEVERITY_##severity)                      \
      ? (void)0                                                            \
      : ::gradsync::logging_internal::Voidify() & GS_LOG_STREAM(severity)

#define GS_CHECK(cond)                                   \
  (cond) ? (void)0                                       \
         : ::gradsync::logging_internal::Voidify() &     \
               GS_LOG_STREAM(FATAL) << "Check failed: " #cond " "

#endif  // GRADSYNC_COMMON_LOGGING_H_
