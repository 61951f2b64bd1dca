// Durable Storage: one SQLite database in WAL mode inside a state directory
// (`DIR/state.db`), locked by one coordinator at a time (`DIR/LOCK`).
#ifndef GRADSYNC_SERVER_STORAGE_SQLITE_STORAGE_H_
#define GRADSYNC_SERVER_STORAGE_SQLITE_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/storage/storage.h"

struct sqlite3;

namespace gradsync {



// Every write is durable when it returns: it is committed in a transaction
// with synchronous=FULL (the WAL is fsynced). Concurrent writers share
// commits (group commit): the first waiting writer commits everyone queued
// behind it in one transaction. Reads use their own connection and see every
// committed write.
//
// Thread-safe. Holds the directory's lock (flock on DIR/LOCK) from Open()
// until destruction, so a second coordinator on the same directory is
// refused with FAILED_PRECONDITION naming the holder's pid.
class SqliteStorage final : public Storage {
 public:
  // Opens the state in `dir`, creating the directory and an empty database
  // when absent. Errors, each naming the path and what to do:
  // FAILED_PRECONDITION when another process holds the lock, or the state
  // has another format (written by an older or newer gradsync); DATA_LOSS
  // when the database is corrupt or not a gradsync state; UNAVAILABLE when
  // the directory cannot be created, written or locked.
  static absl::StatusOr<std::unique_ptr<SqliteStorage>> Open(
      const std::string& dir);

  ~SqliteStorage() override;
  SqliteStorage(const SqliteStorage&) = delete;
  SqliteStorage& operator=(const SqliteStorage&) = delete;

  absl::Status Put(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) const override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::StatusOr<std::vector<Entry>> Scan(absl::string_view prefix,
                                          bool keys_only) const override;
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override;
  absl::Status Apply(const std::vector<Mutation>& batch) override;

 private:
  // One queued write and, once committed, its outcome.
  struct Write;

  SqliteStorage(std::string path, int lock_fd, sqlite3* writer,
                sqlite3* reader);

  // Queues `writes` together and returns once the commit that includes
  // them has ended (its status).
  absl::Status Commit(const std::vector<Write*>& writes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Applies `batch` in one transaction on writer_ (all or none).
  absl::Status CommitBatch(const std::vector<Write*>& batch);

  const std::string path_;  // DIR/state.db, for errors
  const int lock_fd_;
  sqlite3* const writer_;  // used only by the committing thread
  sqlite3* const reader_ ABSL_PT_GUARDED_BY(read_mu_);

  absl::Mutex mu_;
  std::vector<Write*> queued_ ABSL_GUARDED_BY(mu_);
  bool committing_ ABSL_GUARDED_BY(mu_) = false;

  mutable absl::Mutex read_mu_;
};

// Verifies the state in `dir` without changing it: the format, and SQLite's
// full integrity check. Safe while a coordinator serves from it (WAL readers
// do not block the writer). Errors as for SqliteStorage::Open, and NOT_FOUND
// when `dir` holds no state.
absl::StatusOr<StateSummary> CheckStateDir(const std::string& dir);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_STORAGE_SQLITE_STORAGE_H_
