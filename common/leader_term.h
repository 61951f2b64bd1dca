// Which leadership term answered a call. Under etcd leadership
// (gradsync-coordinator --etcd) a replica's term is the create revision of
// the leader key it holds: every new leader's is larger. The leader sends
// its term with each key-value answer, in trailing metadata, and when (by
// its clock) it answered, so that a fault test can check every
// acknowledgement against the terms' beginnings: no replica answers after a
// newer term began (tests/netns/check_terms.py).
#ifndef GRADSYNC_COMMON_LEADER_TERM_H_
#define GRADSYNC_COMMON_LEADER_TERM_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gradsync {

// The trailing metadata key; its value is "TERM ANSWERED_AT" (the answer's
// time in Unix microseconds).
inline constexpr char kTermMetadataKey[] = "gradsync-term";

// One answer's term, and when it was sent.
struct TermStamp {
  int64_t term = 0;
  absl::Time answered_at;
};

inline std::string FormatTermStamp(const TermStamp& stamp) {
  return absl::StrCat(stamp.term, " ", absl::ToUnixMicros(stamp.answered_at));
}

// nullopt for a value that is not "TERM MICROS" with a term > 0.
inline std::optional<TermStamp> ParseTermStamp(absl::string_view text) {
  const size_t space = text.find(' ');
  TermStamp stamp;
  int64_t micros = 0;
  if (space == absl::string_view::npos ||
      !absl::SimpleAtoi(text.substr(0, space), &stamp.term) ||
      !absl::SimpleAtoi(text.substr(space + 1), &micros) || stamp.term <= 0) {
    return std::nullopt;
  }
  stamp.answered_at = absl::FromUnixMicros(micros);
  return stamp;
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_LEADER_TERM_H_
