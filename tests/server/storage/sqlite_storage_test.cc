// SqliteStorage beyond the shared conformance suite: state survives a reopen
// and a kill -9 in the middle of writes; a locked, foreign, newer, older or
// corrupt state directory is refused with a clear error and left unchanged.
#include "server/storage/sqlite_storage.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

class SqliteStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempPath(absl::StrCat(
        "sqlite-", ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
  }

  std::string db_path() const { return dir_ + "/state.db"; }

  // Runs `sql` on the state database directly, as another program would.
  void RunSql(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(db_path().c_str(), &db), SQLITE_OK);
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
        << (error != nullptr ? error : "");
    sqlite3_free(error);
    sqlite3_close(db);
  }

  std::string dir_;
};

TEST_F(SqliteStorageTest, StateSurvivesAReopen) {
  {
    auto storage = SqliteStorage::Open(dir_);
    ASSERT_TRUE(storage.ok()) << storage.status();
    ASSERT_TRUE((*storage)->Put("jobs/a", "config").ok());
    ASSERT_TRUE((*storage)->Put("kv/a/1/k", "v").ok());
    ASSERT_TRUE((*storage)->Put("kv/a/1/gone", "v").ok());
    ASSERT_TRUE((*storage)->Delete("kv/a/1/gone").ok());
  }
  auto storage = SqliteStorage::Open(dir_);
  ASSERT_TRUE(storage.ok()) << storage.status();
  EXPECT_EQ((*storage)->Get("jobs/a").value(), "config");
  EXPECT_EQ((*storage)->Get("kv/a/1/k").value(), "v");
  EXPECT_EQ((*storage)->Get("kv/a/1/gone").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SqliteStorageTest, ASecondOpenWhileLockedNamesTheHolder) {
  auto first = SqliteStorage::Open(dir_);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SqliteStorage::Open(dir_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("in use by another coordinator (pid ",
                                     getpid(), ")")));
  first->reset();  // releases the lock
  EXPECT_TRUE(SqliteStorage::Open(dir_).ok());
}

TEST_F(SqliteStorageTest, StateOfANewerFormatIsRefusedAndKept) {
  {
    auto storage = SqliteStorage::Open(dir_);
    ASSERT_TRUE(storage.ok()) << storage.status();
    ASSERT_TRUE((*storage)->Put("jobs/a", "config").ok());
  }
  RunSql(absl::StrCat("PRAGMA user_version=", kStateFormat + 1));
  auto storage = SqliteStorage::Open(dir_);
  EXPECT_EQ(storage.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(storage.status().message(), HasSubstr("written by a newer gradsync"));
  RunSql(absl::StrCat("PRAGMA user_version=", kStateFormat));
  storage = SqliteStorage::Open(dir_);
  ASSERT_TRUE(storage.ok()) << storage.status();
  EXPECT_EQ((*storage)->Get("jobs/a").value(), "config");  // never reset
}

TEST_F(SqliteStorageTest, StateOfAnOlderReadableFormatIsRaisedAtOpen) {
  {
    auto storage = SqliteStorage::Open(dir_);
    ASSERT_TRUE(storage.ok()) << storage.status();
    ASSERT_TRUE((*storage)->Put("jobs/a", "record").ok());
  }
  RunSql(absl::StrCat("PRAGMA user_version=", kOldestStateFormat));
  // A check reads it as it is, and changes nothing.
  absl::StatusOr<StateSummary> checked = CheckStateDir(dir_);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->format, kOldestStateFormat);
  {
    auto storage = SqliteStorage::Open(dir_);
    ASSERT_TRUE(storage.ok()) << storage.status();
    EXPECT_EQ((*storage)->Get("jobs/a").value(), "record");
  }
  checked = CheckStateDir(dir_);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->format, kStateFormat);
}

TEST_F(SqliteStorageTest, StateOfAnOlderFormatIsRefused) {
  { ASSERT_TRUE(SqliteStorage::Open(dir_).ok()); }
  RunSql(absl::StrCat("PRAGMA user_version=", kOldestStateFormat - 1));
  auto storage = SqliteStorage::Open(dir_);
  EXPECT_EQ(storage.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(storage.status().message(), HasSubstr("written by an older gradsync"));
}

TEST_F(SqliteStorageTest, AnotherProgramsDatabaseIsRefused) {
  std::filesystem::create_directories(dir_);
  RunSql("CREATE TABLE users (name TEXT)");
  auto storage = SqliteStorage::Open(dir_);
  EXPECT_EQ(storage.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(storage.status().message(), HasSubstr("is not gradsync state"));
}

TEST_F(SqliteStorageTest, AFileThatIsNoDatabaseIsDataLoss) {
  std::filesystem::create_directories(dir_);
  std::ofstream(db_path()) << std::string(8192, 'x');
  auto storage = SqliteStorage::Open(dir_);
  EXPECT_EQ(storage.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(storage.status().message(), HasSubstr(db_path()));
  EXPECT_EQ(CheckStateDir(dir_).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(SqliteStorageTest, CheckSummarizesAndMissingStateIsNotFound) {
  EXPECT_EQ(CheckStateDir(dir_).status().code(), absl::StatusCode::kNotFound);
  {
    auto storage = SqliteStorage::Open(dir_);
    ASSERT_TRUE(storage.ok()) << storage.status();
    ASSERT_TRUE((*storage)->Put("jobs/a", "1").ok());
    ASSERT_TRUE((*storage)->Put("jobs/b", "1").ok());
    ASSERT_TRUE((*storage)->Put("jobs/b/members/1/0", "1").ok());  // a part
    ASSERT_TRUE((*storage)->Put("kv/a/1/x", "1").ok());
    // Checked while the coordinator still holds the directory.
    absl::StatusOr<StateSummary> summary = CheckStateDir(dir_);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->format, kStateFormat);
    EXPECT_EQ(summary->entries, 4);
    EXPECT_EQ(summary->jobs, 2);
    EXPECT_EQ(summary->kv_keys, 1);
  }
}

// A child process writes from 4 threads and reports each acknowledged key on
// a pipe; it is killed with SIGKILL at a random point, 20 times over the same
// directory. Every acknowledged write must be there after each kill.
TEST_F(SqliteStorageTest, EveryAcknowledgedWriteSurvivesKillNine) {
  constexpr int kKills = 20;
  constexpr int kThreads = 4;
  std::mt19937 random(20261123);
  std::set<std::string> acknowledged;
  for (int kill = 0; kill < kKills; ++kill) {
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(pipe_fds[0]);
      auto storage = SqliteStorage::Open(dir_);
      if (!storage.ok()) _exit(3);
      std::vector<std::thread> writers;
      for (int t = 0; t < kThreads; ++t) {
        writers.emplace_back([&, t] {
          for (int i = 0;; ++i) {
            const std::string key = absl::StrCat("kv/job/", kill, "/", t, "-", i);
            if (!(*storage)->Put(key, absl::StrCat("value-", key)).ok()) _exit(4);
            const std::string line = key + "\n";  // < PIPE_BUF: atomic
            if (write(pipe_fds[1], line.data(), line.size()) < 0) _exit(5);
          }
        });
      }
      for (std::thread& w : writers) w.join();
      _exit(0);
    }
    close(pipe_fds[1]);
    // Read a random number of acknowledgements, then kill mid-write.
    const int wanted = std::uniform_int_distribution<int>(1, 60)(random);
    std::string text;
    char buffer[4096];
    int lines = 0;
    while (lines < wanted) {
      const ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
      if (n <= 0) break;
      text.append(buffer, n);
      lines = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
    }
    ::kill(pid, SIGKILL);
    // Acknowledgements written before the kill are still in the pipe.
    for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) {
      text.append(buffer, n);
    }
    close(pipe_fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "writer exited with " << WEXITSTATUS(status);
    ASSERT_GE(lines, 1) << "the writer acknowledged nothing";
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      acknowledged.insert(std::string(line));
    }
    auto storage = SqliteStorage::Open(dir_);
    ASSERT_TRUE(storage.ok()) << "after kill " << kill << ": " << storage.status();
    for (const std::string& key : acknowledged) {
      absl::StatusOr<std::string> value = (*storage)->Get(key);
      ASSERT_TRUE(value.ok()) << "after kill " << kill << ", acknowledged " << key
                              << " is lost: " << value.status();
      ASSERT_EQ(*value, "value-" + key);
    }
  }
  absl::StatusOr<StateSummary> summary = CheckStateDir(dir_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_GE(summary->kv_keys, static_cast<int64_t>(acknowledged.size()));
}

}  // namespace
}  // namespace gradsync
