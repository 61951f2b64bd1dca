// The coordinator's persistent state sits behind this small interface: an
// ordered map from string keys to byte values. InMemoryStorage for tests and
// a coordinator without state; SqliteStorage for --state_dir. Every backend
// passes tests/server/storage/storage_conformance_test.
#ifndef GRADSYNC_SERVER_STORAGE_STORAGE_H_
#define GRADSYNC_SERVER_STORAGE_STORAGE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// The format of the state this binary writes, kept by every durable backend
// (SQLite's user_version, an etcd key). State of a format from
// kOldestStateFormat on is read; a writable open raises its marker to
// kStateFormat (the coordinator rewrites what changed as it loads it), so
// that an older binary refuses it. State of any other format is refused at
// open, never reset.
//   1: a job's record held its members (jobs/<id>);
//   2: in parts (server/job_records.h).
inline constexpr int kStateFormat = 2;
inline constexpr int kOldestStateFormat = 1;

// An ordered key-value map. Implementations are thread-safe; each call is
// atomic on its own (callers that need read-modify-write atomicity hold their
// own lock around the calls).
class Storage {
 public:
  using Entry = std::pair<std::string, std::string>;

  // One change of a batch (see Apply).
  struct Mutation {
    enum class Kind { kPut, kDelete, kDeletePrefix };
    Kind kind = Kind::kPut;
    std::string key;    // the prefix for kDeletePrefix
    std::string value;  // for kPut
    // Applied in the same transaction as the next mutation of the batch,
    // also by a backend that splits a batch into several (etcd): a write
    // and the record that says it was made (KvManager's request ids).
    bool with_next = false;
  };

  virtual ~Storage() = default;

  // Stores `value` under `key`, replacing any previous value.
  virtual absl::Status Put(absl::string_view key, absl::string_view value) = 0;
  // Returns the value of `key`; NOT_FOUND when absent.
  virtual absl::StatusOr<std::string> Get(absl::string_view key) const = 0;
  // Removes `key`; returns whether it existed.
  virtual absl::StatusOr<bool> Delete(absl::string_view key) = 0;
  // Returns the entries whose key starts with `prefix`, in key order. With
  // `keys_only` the values are left empty.
  virtual absl::StatusOr<std::vector<Entry>> Scan(absl::string_view prefix,
                                                  bool keys_only) const = 0;
  // Removes every key that starts with `prefix`; returns how many.
  virtual absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) = 0;
  // Applies `batch` in order and atomically: when it returns OK all of it
  // is stored (durably, for a durable backend), otherwise none of it. One
  // call costs a durable backend one commit, however long the batch.
  virtual absl::Status Apply(const std::vector<Mutation>& batch) = 0;
};

// The smallest string greater than every string starting with `prefix`: the
// exclusive end of a prefix scan. None when there is no such string (the
// prefix is empty or all 0xff bytes: the scan runs to the end).
inline std::optional<std::string> PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) {
    end.pop_back();
  }
  if (end.empty()) return std::nullopt;
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

// What a state check (gradsync-coordinator --check_state) found.
struct StateSummary {
  int format = 0;
  int64_t entries = 0;
  int64_t jobs = 0;     // job records (keys "jobs/<id>")
  int64_t kv_keys = 0;  // keys under "kv/"
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STORAGE_STORAGE_H_
