// Error texts on the wire: the most a worker may report (a heartbeat's
// metrics.last_error, a completion's message, a stacks capture's error),
// and the cut that keeps a longer one within it. The coordinator refuses a
// longer text (server/health_wire.cc), and a refused heartbeat ends the
// member's stream, so every worker-side text goes through CutErrorText.
#ifndef GRADSYNC_COMMON_ERROR_TEXT_H_
#define GRADSYNC_COMMON_ERROR_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace gradsync {

// The most bytes of an error text a worker may report.
inline constexpr size_t kMaxErrorBytes = 4096;

// `text` when it fits in `max_bytes`; else its head, cut at a UTF-8
// character boundary, and " ... (N bytes cut)", together at most
// `max_bytes`. Pure; thread-safe.
std::string CutErrorText(absl::string_view text,
                         size_t max_bytes = kMaxErrorBytes);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_ERROR_TEXT_H_
