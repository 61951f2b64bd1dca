#include "server/storage/sqlite_storage.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// SQLite's application_id for gradsync state: "gsnc".
constexpr int32_t kApplicationId = 0x67736e63;
constexpr int kBusyTimeoutMs = 5000;

std::string DatabasePath(const std::string& dir) {
  return (std::filesystem::path(dir) / "state.db").string();
}

// A status for SQLite result `rc` on `db`, naming `path` and `what` failed.
absl::Status SqliteError(sqlite3* db, int rc, const std::string& path,
                         absl::string_view what) {
  const std::string message =
      absl::StrCat("state database ", path, ": ", what, ": ",
                   db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(
          absl::StrCat(message, " (restore the state directory from a backup)"));
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// One prepared statement; finalized on destruction. Binds blobs, so keys
// compare byte by byte (memcmp), as std::string does.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& path, const char* sql)
      : db_(db), path_(path), sql_(sql) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& Bind(int index, absl::string_view bytes) {
    if (rc_ == SQLITE_OK) {
      // A non-null pointer even for "", so that it binds an empty blob.
      rc_ = sqlite3_bind_blob(stmt_, index, bytes.empty() ? "" : bytes.data(),
                              static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
    }
    return *this;
  }

  // Steps once: true with a row, false when done.
  absl::StatusOr<bool> Step() {
    if (rc_ != SQLITE_OK && rc_ != SQLITE_ROW && rc_ != SQLITE_DONE) {
      return SqliteError(db_, rc_, path_, sql_);
    }
    rc_ = sqlite3_step(stmt_);
    if (rc_ == SQLITE_ROW) return true;
    if (rc_ == SQLITE_DONE) return false;
    return SqliteError(db_, rc_, path_, sql_);
  }

  // Runs to completion, ignoring rows.
  absl::Status Run() {
    for (;;) {
      GS_ASSIGN_OR_RETURN(bool row, Step());
      if (!row) return absl::OkStatus();
    }
  }

  std::string Column(int column) const {
    const void* data = sqlite3_column_blob(stmt_, column);
    const int size = sqlite3_column_bytes(stmt_, column);
    return data == nullptr ? std::string()
                           : std::string(static_cast<const char*>(data), size);
  }
  int64_t IntColumn(int column) const {
    return sqlite3_column_int64(stmt_, column);
  }

 private:
  sqlite3* const db_;
  const std::string& path_;
  const char* const sql_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

absl::StatusOr<int64_t> QueryInt(sqlite3* db, const std::string& path,
                                 const char* sql) {
  Statement statement(db, path, sql);
  GS_ASSIGN_OR_RETURN(bool row, statement.Step());
  return row ? statement.IntColumn(0) : 0;
}

absl::Status Exec(sqlite3* db, const std::string& path, const char* sql) {
  return Statement(db, path, sql).Run();
}

// Opens `path` with `flags`; the handle is closed on error.
absl::StatusOr<sqlite3*> OpenDatabase(const std::string& path, int flags) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteError(db, rc, path, "cannot open");
    sqlite3_close(db);
    return status;
  }
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  sqlite3_extended_result_codes(db, 1);
  return db;
}

// Checks that `db` holds gradsync state of a format this binary reads;
// returns the format. With `create`, an empty database is made one of
// kStateFormat and an older format is raised to it; `integrity_check` picks
// the full check over the quick one.
absl::StatusOr<int64_t> CheckFormat(sqlite3* db, const std::string& path,
                                    bool create, bool integrity_check) {
  GS_ASSIGN_OR_RETURN(int64_t application_id,
                      QueryInt(db, path, "PRAGMA application_id"));
  GS_ASSIGN_OR_RETURN(int64_t format, QueryInt(db, path, "PRAGMA user_version"));
  GS_ASSIGN_OR_RETURN(int64_t tables,
                      QueryInt(db, path, "SELECT count(*) FROM sqlite_master"));
  if (application_id == 0 && format == 0 && tables == 0 && create) {
    GS_RETURN_IF_ERROR(Exec(db, path,
                            "CREATE TABLE entries (key BLOB PRIMARY KEY, "
                            "value BLOB NOT NULL) WITHOUT ROWID"));
    GS_RETURN_IF_ERROR(Exec(
        db, path, absl::StrCat("PRAGMA application_id=", kApplicationId).c_str()));
    GS_RETURN_IF_ERROR(Exec(
        db, path, absl::StrCat("PRAGMA user_version=", kStateFormat).c_str()));
    return kStateFormat;
  }
  if (application_id != kApplicationId) {
    return absl::DataLossError(absl::StrCat(
        "state database ", path,
        " is not gradsync state (SQLite application_id ", application_id,
        "): point --state_dir at a gradsync state directory or an empty one"));
  }
  if (format < kOldestStateFormat || format > kStateFormat) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state database ", path, " has state format ", format,
        ", this gradsync-coordinator reads formats ", kOldestStateFormat, "-",
        kStateFormat, ": it was ",
        format > kStateFormat ? "written by a newer" : "written by an older",
        " gradsync; run that version, or restore a backup made by this one"));
  }
  Statement check(db, path,
                  integrity_check ? "PRAGMA integrity_check" : "PRAGMA quick_check");
  GS_ASSIGN_OR_RETURN(bool row, check.Step());
  const std::string verdict = row ? check.Column(0) : "no answer";
  if (verdict != "ok") {
    return absl::DataLossError(absl::StrCat(
        "state database ", path, " is corrupt (", verdict,
        "): restore the state directory from a backup"));
  }
  if (create && format < kStateFormat) {
    GS_RETURN_IF_ERROR(Exec(
        db, path, absl::StrCat("PRAGMA user_version=", kStateFormat).c_str()));
    GS_LOG(INFO) << "state database " << path << ": state format " << format
                 << " raised to " << kStateFormat;
    return kStateFormat;
  }
  return format;
}

// Takes DIR/LOCK; returns its descriptor.
absl::StatusOr<int> LockDir(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "LOCK").string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ",
                                               std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[32] = {0};
    if (pread(fd, holder, sizeof(holder) - 1, 0) < 0) holder[0] = '\0';
    close(fd);
    if (error == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state directory ", dir, " is in use by another coordinator (pid ",
          absl::StripAsciiWhitespace(holder),
          "): stop it first, or give this one another --state_dir"));
    }
    return absl::UnavailableError(absl::StrCat("cannot lock ", path, ": ",
                                               std::strerror(error)));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ",
                                               std::strerror(errno)));
  }
  return fd;
}

}  // namespace

struct SqliteStorage::Write {
  using Kind = Mutation::Kind;
  Kind kind;
  std::string key;
  std::string value;
  int64_t changes = 0;  // rows deleted
  absl::Status status;
  bool done = false;
};

absl::StatusOr<std::unique_ptr<SqliteStorage>> SqliteStorage::Open(
    const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create state directory ", dir, ": ", error.message()));
  }
  GS_ASSIGN_OR_RETURN(int lock_fd, LockDir(dir));
  const std::string path = DatabasePath(dir);
  absl::StatusOr<sqlite3*> writer =
      OpenDatabase(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  absl::Status status = writer.status();
  if (status.ok()) {
    status = CheckFormat(*writer, path, /*create=*/true, /*integrity_check=*/false)
                 .status();
  }
  if (status.ok()) {
    // WAL: readers never block the writer; FULL: a commit is on disk.
    status = Exec(*writer, path, "PRAGMA journal_mode=WAL");
  }
  if (status.ok()) status = Exec(*writer, path, "PRAGMA synchronous=FULL");
  absl::StatusOr<sqlite3*> reader = absl::UnknownError("not opened");
  if (status.ok()) {
    reader = OpenDatabase(path, SQLITE_OPEN_READONLY);
    status = reader.status();
  }
  if (!status.ok()) {
    if (writer.ok()) sqlite3_close(*writer);
    close(lock_fd);
    return status;
  }
  return std::unique_ptr<SqliteStorage>(
      new SqliteStorage(path, lock_fd, *writer, *reader));
}

SqliteStorage::SqliteStorage(std::string path, int lock_fd, sqlite3* writer,
                             sqlite3* reader)
    : path_(std::move(path)), lock_fd_(lock_fd), writer_(writer), reader_(reader) {}

SqliteStorage::~SqliteStorage() {
  sqlite3_close(reader_);
  sqlite3_close(writer_);
  close(lock_fd_);  // releases the flock
}

absl::Status SqliteStorage::Put(absl::string_view key, absl::string_view value) {
  Write write{Write::Kind::kPut, std::string(key), std::string(value)};
  return Commit({&write});
}

absl::StatusOr<bool> SqliteStorage::Delete(absl::string_view key) {
  Write write{Write::Kind::kDelete, std::string(key), ""};
  GS_RETURN_IF_ERROR(Commit({&write}));
  return write.changes > 0;
}

absl::StatusOr<int64_t> SqliteStorage::DeletePrefix(absl::string_view prefix) {
  Write write{Write::Kind::kDeletePrefix, std::string(prefix), ""};
  GS_RETURN_IF_ERROR(Commit({&write}));
  return write.changes;
}

absl::Status SqliteStorage::Apply(const std::vector<Mutation>& batch) {
  if (batch.empty()) return absl::OkStatus();
  std::vector<Write> writes;
  writes.reserve(batch.size());
  std::vector<Write*> queued;
  for (const Mutation& m : batch) {
    writes.push_back(Write{m.kind, m.key, m.value});
    queued.push_back(&writes.back());
  }
  return Commit(queued);
}

absl::Status SqliteStorage::Commit(const std::vector<Write*>& writes) {
  // Queued together, the writes are committed in one transaction: waiting
  // for the last is waiting for all.
  Write* const write = writes.back();
  struct Ready {
    const Write* write;
    const bool* committing;
    bool operator()() const { return write->done || !*committing; }
  };
  absl::MutexLock lock(&mu_);
  queued_.insert(queued_.end(), writes.begin(), writes.end());
  while (!write->done) {
    if (committing_) {
      const Ready ready{write, &committing_};
      mu_.Await(absl::Condition(&ready));
      continue;
    }
    // Lead: commit everything queued so far, this write included.
    std::vector<Write*> batch;
    batch.swap(queued_);
    committing_ = true;
    mu_.Unlock();
    const absl::Status status = CommitBatch(batch);
    mu_.Lock();
    for (Write* w : batch) {
      if (!status.ok()) w->status = status;
      w->done = true;
    }
    committing_ = false;
  }
  return write->status;
}

absl::Status SqliteStorage::CommitBatch(const std::vector<Write*>& batch) {
  const std::string& name = path_;
  GS_RETURN_IF_ERROR(Exec(writer_, name, "BEGIN IMMEDIATE"));
  absl::Status status;
  for (Write* write : batch) {
    std::optional<std::string> end;
    switch (write->kind) {
      case Write::Kind::kPut:
        status = Statement(writer_, name,
                           "INSERT OR REPLACE INTO entries(key, value) "
                           "VALUES(?1, ?2)")
                     .Bind(1, write->key)
                     .Bind(2, write->value)
                     .Run();
        break;
      case Write::Kind::kDelete:
        status = Statement(writer_, name, "DELETE FROM entries WHERE key = ?1")
                     .Bind(1, write->key)
                     .Run();
        break;
      case Write::Kind::kDeletePrefix:
        end = PrefixEnd(write->key);
        status = end.has_value()
                     ? Statement(writer_, name,
                                 "DELETE FROM entries WHERE key >= ?1 AND key < ?2")
                           .Bind(1, write->key)
                           .Bind(2, *end)
                           .Run()
                     : Statement(writer_, name, "DELETE FROM entries WHERE key >= ?1")
                           .Bind(1, write->key)
                           .Run();
        break;
    }
    if (!status.ok()) break;
    write->changes = sqlite3_changes(writer_);
  }
  if (status.ok()) status = Exec(writer_, name, "COMMIT");
  if (!status.ok()) (void)Exec(writer_, name, "ROLLBACK");
  return status;
}

absl::StatusOr<std::string> SqliteStorage::Get(absl::string_view key) const {
  absl::MutexLock lock(&read_mu_);
  Statement statement(reader_, path_, "SELECT value FROM entries WHERE key = ?1");
  statement.Bind(1, key);
  GS_ASSIGN_OR_RETURN(bool row, statement.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("key '", key, "' not found"));
  return statement.Column(0);
}

absl::StatusOr<std::vector<Storage::Entry>> SqliteStorage::Scan(
    absl::string_view prefix, bool keys_only) const {
  absl::MutexLock lock(&read_mu_);
  const std::optional<std::string> end = PrefixEnd(prefix);
  const char* sql =
      end.has_value()
          ? (keys_only ? "SELECT key FROM entries WHERE key >= ?1 AND key < ?2 "
                         "ORDER BY key"
                       : "SELECT key, value FROM entries WHERE key >= ?1 AND "
                         "key < ?2 ORDER BY key")
          : (keys_only ? "SELECT key FROM entries WHERE key >= ?1 ORDER BY key"
                       : "SELECT key, value FROM entries WHERE key >= ?1 "
                         "ORDER BY key");
  Statement statement(reader_, path_, sql);
  statement.Bind(1, prefix);
  if (end.has_value()) statement.Bind(2, *end);
  std::vector<Entry> entries;
  for (;;) {
    GS_ASSIGN_OR_RETURN(bool row, statement.Step());
    if (!row) return entries;
    entries.emplace_back(statement.Column(0),
                         keys_only ? std::string() : statement.Column(1));
  }
}

absl::StatusOr<StateSummary> CheckStateDir(const std::string& dir) {
  const std::string path = DatabasePath(dir);
  if (!std::filesystem::exists(path)) {
    return absl::NotFoundError(
        absl::StrCat("no gradsync state in ", dir, " (", path, " is missing)"));
  }
  GS_ASSIGN_OR_RETURN(sqlite3 * db, OpenDatabase(path, SQLITE_OPEN_READONLY));
  auto summarize = [&]() -> absl::StatusOr<StateSummary> {
    StateSummary summary;
    GS_ASSIGN_OR_RETURN(summary.format, CheckFormat(db, path, /*create=*/false,
                                                    /*integrity_check=*/true));
    GS_ASSIGN_OR_RETURN(summary.entries,
                        QueryInt(db, path, "SELECT count(*) FROM entries"));
    GS_ASSIGN_OR_RETURN(
        summary.jobs,
        QueryInt(db, path,
                 "SELECT count(*) FROM entries WHERE key >= CAST('jobs/' AS "
                 "BLOB) AND key < CAST('jobs0' AS BLOB) AND "
                 "instr(substr(CAST(key AS TEXT), 6), '/') = 0"));
    GS_ASSIGN_OR_RETURN(
        summary.kv_keys,
        QueryInt(db, path,
                 "SELECT count(*) FROM entries WHERE key >= CAST('kv/' AS "
                 "BLOB) AND key < CAST('kv0' AS BLOB)"));
    return summary;
  };
  absl::StatusOr<StateSummary> summary = summarize();
  sqlite3_close(db);
  return summary;
}

}  // namespace gradsync
