#include "worker/backend/file_store.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gradsync {

FileStore::FileStore(std::string dir, const std::atomic<bool>* cancel)
    : dir_(std::move(dir)), cancel_(cancel) {}

std::string FileStore::Path(const std::string& key) const {
  // One file per key, whatever it holds: '/' and '%' are escaped.
  std::string name;
  for (char c : key) {
    if (c == '/') {
      name += "%2F";
    } else if (c == '%') {
      name += "%25";
    } else {
      name += c;
    }
  }
  return absl::StrCat(dir_, "/", name);
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  const std::string temp = absl::StrCat(Path(key), ".", getpid(), ".",
                                        reinterpret_cast<uintptr_t>(&value),
                                        ".tmp");
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << value;
    if (!out) {
      return absl::InternalError(absl::StrCat("file store: cannot write ", temp));
    }
  }
  if (std::rename(temp.c_str(), Path(key).c_str()) != 0) {
    const int error = errno;
    std::remove(temp.c_str());
    return absl::InternalError(absl::StrCat("file store: rename to ", Path(key),
                                            ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key,
                                           absl::Duration timeout) {
  absl::Status waited = Wait({key}, timeout);
  if (!waited.ok()) return waited;
  std::ifstream file(Path(key), std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("file store: ", Path(key), " was removed while read"));
  }
  std::stringstream value;
  value << file.rdbuf();
  return value.str();
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys,
                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  for (const std::string& key : keys) {
    while (access(Path(key).c_str(), F_OK) != 0) {
      if (cancel_ != nullptr && cancel_->load()) {
        return absl::CancelledError(
            absl::StrCat("file store: the wait for '", key, "' was cancelled"));
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("file store: '", key, "' did not appear in ", dir_,
                         " within ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(std::min(pause, deadline - now));
      pause = std::min(pause * 2, absl::Milliseconds(10));
    }
  }
  return absl::OkStatus();
}

void FileStore::Remove(const std::string& key) { std::remove(Path(key).c_str()); }

absl::StatusOr<std::string> FileStore::MakeDirectory(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
  if (base == nullptr || *base == '\0') base = "/tmp";
  std::string pattern = absl::StrCat(base, "/", prefix, ".XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a directory ", pattern,
                                            ": ", std::strerror(errno)));
  }
  return pattern;
}

}  // namespace gradsync
