#include "worker/torch/c10d_store.h"

#include <chrono>
#include <exception>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration timeout) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
}

// The status of a call that threw `e`.
absl::Status Thrown(const std::string& what, const std::exception& e) {
  const std::string message = e.what();
  const std::string text = absl::StrCat("torch store: ", what, ": ", message);
  const std::string lower = absl::AsciiStrToLower(message);
  if (absl::StrContains(lower, "timeout") ||
      absl::StrContains(lower, "timed out")) {
    return absl::DeadlineExceededError(text);
  }
  return absl::UnavailableError(text);
}

}  // namespace

absl::Status C10dStore::Set(const std::string& key, const std::string& value) {
  try {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return Thrown(absl::StrCat("set '", key, "'"), e);
  }
}

absl::StatusOr<std::string> C10dStore::Get(const std::string& key,
                                           absl::Duration timeout) {
  try {
    store_->wait({key}, ToChrono(timeout));
    const std::vector<uint8_t> value = store_->get(key);
    return std::string(value.begin(), value.end());
  } catch (const std::exception& e) {
    return Thrown(absl::StrCat("get '", key, "'"), e);
  }
}

absl::Status C10dStore::Wait(const std::vector<std::string>& keys,
                             absl::Duration timeout) {
  try {
    store_->wait(keys, ToChrono(timeout));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return Thrown(absl::StrCat("wait for '", absl::StrJoin(keys, "', '"), "'"),
                  e);
  }
}

}  // namespace gradsync
