#include "server/storage/in_memory_storage.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/storage/storage.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

class InMemoryStorageTest : public ::testing::Test {
 protected:
  // Exercised through the interface, as the managers use it.
  std::unique_ptr<Storage> storage_ = std::make_unique<InMemoryStorage>();
};

TEST_F(InMemoryStorageTest, GetReturnsWhatPutStored) {
  ASSERT_TRUE(storage_->Put("k", "v").ok());
  absl::StatusOr<std::string> value = storage_->Get("k");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST_F(InMemoryStorageTest, PutReplacesThePreviousValue) {
  ASSERT_TRUE(storage_->Put("k", "a long first value").ok());
  ASSERT_TRUE(storage_->Put("k", "b").ok());
  EXPECT_EQ(storage_->Get("k").value(), "b");
}

TEST_F(InMemoryStorageTest, StoresBinaryValuesAndEmptyValues) {
  const std::string binary("\0\x01\xff\0z", 5);
  ASSERT_TRUE(storage_->Put("bin", binary).ok());
  ASSERT_TRUE(storage_->Put("empty", "").ok());
  EXPECT_EQ(storage_->Get("bin").value(), binary);
  absl::StatusOr<std::string> empty = storage_->Get("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");
}

TEST_F(InMemoryStorageTest, GetOfMissingKeyIsNotFound) {
  absl::StatusOr<std::string> value = storage_->Get("missing");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(value.status().message(), HasSubstr("missing"));
}

TEST_F(InMemoryStorageTest, DeleteReportsWhetherTheKeyExisted) {
  ASSERT_TRUE(storage_->Put("k", "v").ok());
  absl::StatusOr<bool> first = storage_->Delete("k");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  EXPECT_EQ(storage_->Get("k").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<bool> second = storage_->Delete("k");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(*second);
}

TEST_F(InMemoryStorageTest, ScanReturnsOnlyPrefixMatchesInKeyOrder) {
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

TEST_F(InMemoryStorageTest, ScanWithEmptyPrefixReturnsEverythingSorted) {
  for (const char* key : {"z", "a", "m"}) {
    ASSERT_TRUE(storage_->Put(key, key).ok());
  }
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      storage_->Scan("", /*keys_only=*/false);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries,
              ElementsAre(Pair("a", "a"), Pair("m", "m"), Pair("z", "z")));
}

TEST_F(InMemoryStorageTest, ScanKeysOnlyLeavesValuesEmpty) {
  ASSERT_TRUE(storage_->Put("p/a", "value-a").ok());
  ASSERT_TRUE(storage_->Put("p/b", "value-b").ok());
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      storage_->Scan("p/", /*keys_only=*/true);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, ElementsAre(Pair("p/a", ""), Pair("p/b", "")));
  // The values themselves are untouched.
  EXPECT_EQ(storage_->Get("p/a").value(), "value-a");
}

TEST_F(InMemoryStorageTest, ScanWithNoMatchesIsEmptyNotAnError) {
  ASSERT_TRUE(storage_->Put("a", "1").ok());
  absl::StatusOr<std::vector<Storage::Entry>> entries =
      storage_->Scan("b", /*keys_only=*/false);
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, IsEmpty());
}

TEST_F(InMemoryStorageTest, DeletePrefixRemovesExactlyTheMatchesAndCountsThem) {
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

TEST_F(InMemoryStorageTest, DeletePrefixWithNoMatchesRemovesNothing) {
  ASSERT_TRUE(storage_->Put("a", "1").ok());
  absl::StatusOr<int64_t> removed = storage_->DeletePrefix("b");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 0);
  EXPECT_TRUE(storage_->Get("a").ok());
}

TEST_F(InMemoryStorageTest, ConcurrentPutsOfDistinctKeysAreAllKept) {
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

}  // namespace
}  // namespace gradsync
