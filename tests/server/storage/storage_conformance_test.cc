// The scenarios every Storage backend must pass, run against each one: the
// managers rely on exactly this behaviour, whichever backend is configured.
// The etcd backend runs against a real etcd-server started for this binary
// (skipped where etcd is not installed or not built in).
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/storage/in_memory_storage.h"
#include "server/storage/sqlite_storage.h"
#include "server/storage/storage.h"
#include "tests/testing/subprocess.h"
#ifdef GRADSYNC_WITH_ETCD
#include "server/storage/etcd_storage.h"
#include "tests/testing/etcd_process.h"
#endif

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

enum class Backend { kInMemory, kSqlite, kEtcd };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  switch (info.param) {
    case Backend::kInMemory:
      return "InMemory";
    case Backend::kSqlite:
      return "Sqlite";
    case Backend::kEtcd:
      return "Etcd";
  }
  return "Unknown";
}

#ifdef GRADSYNC_WITH_ETCD
// One etcd for the whole binary, started by the first etcd test (ctest runs
// each case in a process of its own: the others need none) and stopped at
// exit; each test works under a key prefix of its own.
class EtcdEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { etcd_.reset(); }

  // The running etcd; null (and a test failure) when it cannot start.
  static testing::EtcdProcess* Get() {
    if (etcd_ == nullptr) {
      etcd_ = std::make_unique<testing::EtcdProcess>();
      start_ = etcd_->Start("conformance");
    }
    if (!start_) {
      ADD_FAILURE() << "etcd did not start: " << start_.message();
      return nullptr;
    }
    return etcd_.get();
  }

 private:
  static std::unique_ptr<testing::EtcdProcess> etcd_;
  static ::testing::AssertionResult start_;
};
std::unique_ptr<testing::EtcdProcess> EtcdEnvironment::etcd_;
::testing::AssertionResult EtcdEnvironment::start_ =
    ::testing::AssertionFailure();
::testing::Environment* const kEtcdEnvironment =
    ::testing::AddGlobalTestEnvironment(new EtcdEnvironment);
#endif

class StorageConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kInMemory) {
      storage_ = std::make_unique<InMemoryStorage>();
      return;
    }
    std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    if (GetParam() == Backend::kEtcd) {
#ifdef GRADSYNC_WITH_ETCD
      if (testing::EtcdProcess::Binary().empty()) {
        GTEST_SKIP() << "no etcd binary: install etcd-server";
      }
      testing::EtcdProcess* etcd = EtcdEnvironment::Get();
      ASSERT_NE(etcd, nullptr);
      EtcdOptions options;
      options.endpoints = {etcd->endpoint()};
      options.prefix = absl::StrCat("/", name, "/");
      absl::StatusOr<std::unique_ptr<EtcdStorage>> opened =
          EtcdStorage::Open(options);
      ASSERT_TRUE(opened.ok()) << opened.status();
      storage_ = *std::move(opened);
#else
      GTEST_SKIP() << "built without etcd";
#endif
      return;
    }
    dir_ = testing::TempPath(absl::StrCat("state-", name));
    std::filesystem::remove_all(dir_);
    absl::StatusOr<std::unique_ptr<SqliteStorage>> opened =
        SqliteStorage::Open(dir_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    storage_ = *std::move(opened);
  }

  // Exercised through the interface, as the managers use it.
  std::unique_ptr<Storage> storage_;
  std::string dir_;
};

INSTANTIATE_TEST_SUITE_P(Backends, StorageConformanceTest,
                         ::testing::Values(Backend::kInMemory, Backend::kSqlite,
                                           Backend::kEtcd),
                         BackendName);

TEST_P(StorageConformanceTest, GetReturnsWhatPutStored) {
  ASSERT_TRUE(storage_->Put("k", "v").ok());
  absl::StatusOr<std::string> value = storage_->Get("k");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST_P(StorageConformanceTest, PutReplacesThePreviousValue) {
  ASSERT_TRUE(storage_->Put("k", "a long first value").ok());
  ASSERT_TRUE(storage_->Put("k", "b").ok());
  EXPECT_EQ(storage_->Get("k").value(), "b");
}

TEST_P(StorageConformanceTest, StoresBinaryValuesAndEmptyValues) {
  const std::string binary("\0\x01\xff\0z", 5);
  ASSERT_TRUE(storage_->Put("bin", binary).ok());
  ASSERT_TRUE(storage_->Put("empty", "").ok());
  EXPECT_EQ(storage_->Get("bin").value(), binary);
  absl::StatusOr<std::string> empty = storage_->Get("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");
}

TEST_P(StorageConformanceTest, GetOfMissingKeyIsNotFound) {
  absl::StatusOr<std::string> value = storage_->Get("missing");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(value.status().message(), HasSubstr("missing"));
}

TEST_P(StorageConformanceTest, DeleteReportsWhetherTheKeyExisted) {
  ASSERT_TRUE(storage_->Put("k", "v").ok());
  absl::StatusOr<bool> first = storage_->Delete("k");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  EXPECT_EQ(storage_->Get("k").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<bool> second = storage_->Delete("k");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(*second);
}

TEST_P(StorageConformanceTest, ScanReturnsOnlyPrefixMatchesInKeyOrder) {
  for (const char* key :
       {"b/2", "a/1", "b/10", "b/1", "b", "c/1", "b/", "ba"}) {
    ASSERT_TRUE(storage_->Put(key, absl::StrCat("v:", key)).ok());
  }
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      storage_->Scan("b/", /*keys_only=*/false);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries,
              ElementsAre(Pair("b/", "v:b/"), Pair("b/1", "v:b/1"),
                          Pair("b/10", "v:b/10"), Pair("b/2", "v:b/2")));
}

TEST_P(StorageConformanceTest, ScanWithEmptyPrefixReturnsEverythingSorted) {
  for (const char* key : {"z", "a", "m"}) {
    ASSERT_TRUE(storage_->Put(key, key).ok());
  }
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      storage_->Scan("", /*keys_only=*/false);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries,
              ElementsAre(Pair("a", "a"), Pair("m", "m"), Pair("z", "z")));
}

TEST_P(StorageConformanceTest, ScanKeysOnlyLeavesValuesEmpty) {
  ASSERT_TRUE(storage_->Put("p/a", "value-a").ok());
  ASSERT_TRUE(storage_->Put("p/b", "value-b").ok());
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      storage_->Scan("p/", /*keys_only=*/true);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, ElementsAre(Pair("p/a", ""), Pair("p/b", "")));
  // The values themselves are untouched.
  EXPECT_EQ(storage_->Get("p/a").value(), "value-a");
}

TEST_P(StorageConformanceTest, ScanWithNoMatchesIsEmptyNotAnError) {
  ASSERT_TRUE(storage_->Put("a", "1").ok());
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      storage_->Scan("b", /*keys_only=*/false);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, IsEmpty());
}

TEST_P(StorageConformanceTest, DeletePrefixRemovesExactlyTheMatchesAndCountsThem) {
  for (const char* key :
       {"kv/a/1/x", "kv/a/1/y", "kv/a/2/z", "kv/ab/1/x", "kv/b/1/x", "kv/a"}) {
    ASSERT_TRUE(storage_->Put(key, "v").ok());
  }
  absl::StatusOr<int64_t> removed = storage_->DeletePrefix("kv/a/");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 3);
  absl::StatusOr<std::vector<Storage::Entry>> left =
      storage_->Scan("", /*keys_only=*/true);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_THAT(*left, ElementsAre(Pair("kv/a", ""), Pair("kv/ab/1/x", ""),
                                 Pair("kv/b/1/x", "")));
}

TEST_P(StorageConformanceTest, DeletePrefixWithNoMatchesRemovesNothing) {
  ASSERT_TRUE(storage_->Put("a", "1").ok());
  absl::StatusOr<int64_t> removed = storage_->DeletePrefix("b");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 0);
  EXPECT_TRUE(storage_->Get("a").ok());
}

TEST_P(StorageConformanceTest, ConcurrentPutsOfDistinctKeysAreAllKept) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE(storage_->Put(absl::StrCat("t", t, "/", i), "v").ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  absl::StatusOr<std::vector<Storage::Entry>> all =
      storage_->Scan("t", /*keys_only=*/true);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), static_cast<size_t>(kThreads * kPerThread));
}

TEST_P(StorageConformanceTest, ApplyRunsTheBatchInOrder) {
  ASSERT_TRUE(storage_->Put("old/1", "x").ok());
  ASSERT_TRUE(storage_->Put("gone", "x").ok());
  using Kind = Storage::Mutation::Kind;
  const std::vector<Storage::Mutation> batch = {
      {Kind::kPut, "k", "first"},    {Kind::kPut, "k", "second"},
      {Kind::kDelete, "gone", ""},   {Kind::kPut, "old/2", "y"},
      {Kind::kDeletePrefix, "old/", ""}, {Kind::kPut, "old/3", "z"},
      {Kind::kDelete, "missing", ""},
  };
  ASSERT_TRUE(storage_->Apply(batch).ok());
  absl::StatusOr<std::vector<Storage::Entry>> all =
      storage_->Scan("", /*keys_only=*/false);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(Pair("k", "second"), Pair("old/3", "z")));
  EXPECT_TRUE(storage_->Apply({}).ok()) << "an empty batch is a no-op";
}

TEST_P(StorageConformanceTest, ConcurrentBatchesAreEachWhole) {
  constexpr int kThreads = 6;
  constexpr int kBatches = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int b = 0; b < kBatches; ++b) {
        std::vector<Storage::Mutation> batch;
        for (int i = 0; i < 4; ++i) {
          batch.push_back({Storage::Mutation::Kind::kPut,
                           absl::StrCat("t", t, "/", b, "/", i), "v"});
        }
        EXPECT_TRUE(storage_->Apply(batch).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  absl::StatusOr<std::vector<Storage::Entry>> all =
      storage_->Scan("t", /*keys_only=*/true);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), static_cast<size_t>(kThreads * kBatches * 4));
}

TEST_P(StorageConformanceTest, ScanOfManyKeysReturnsThemAllInOrder) {
  constexpr int kKeys = 2500;  // more than one page of an etcd range read
  std::vector<Storage::Mutation> batch;
  for (int i = 0; i < kKeys; ++i) {
    batch.push_back({Storage::Mutation::Kind::kPut,
                     absl::StrCat("many/", 100000 + i), absl::StrCat(i)});
  }
  ASSERT_TRUE(storage_->Apply(batch).ok());
  absl::StatusOr<std::vector<Storage::Entry>> all =
      storage_->Scan("many/", /*keys_only=*/false);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_EQ((*all)[i].first, absl::StrCat("many/", 100000 + i));
    ASSERT_EQ((*all)[i].second, absl::StrCat(i));
  }
  absl::StatusOr<int64_t> removed = storage_->DeletePrefix("many/");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, kKeys);
}

TEST_P(StorageConformanceTest, PrefixesEndingInFfBytesMatchExactly) {
  const std::string ff("p\xff", 2);
  const std::string ffff("p\xff\xff", 3);
  for (const std::string& key :
       {std::string("p"), ff, ff + "a", ffff, ffff + "b", std::string("q")}) {
    ASSERT_TRUE(storage_->Put(key, "v").ok());
  }
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      storage_->Scan(ff, /*keys_only=*/true);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, ElementsAre(Pair(ff, ""), Pair(ff + "a", ""),
                                    Pair(ffff, ""), Pair(ffff + "b", "")));
  absl::StatusOr<int64_t> removed = storage_->DeletePrefix(ffff);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);
  EXPECT_TRUE(storage_->Get("q").ok());
}

}  // namespace
}  // namespace gradsync
