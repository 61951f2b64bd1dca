// A Storage whose writes a test controls: InMemoryStorage underneath, with
// batches (Apply) that can be held at a gate, and writes that fail always
// ("disk gone", every kind of write), once (the next batch, "disk full",
// storing nothing) or for the batches that put a key under a prefix; the test can wait for batches to enter and read the
// sizes of those that did. Thread-safe.
#ifndef GRADSYNC_TESTS_TESTING_CONTROLLED_STORAGE_H_
#define GRADSYNC_TESTS_TESTING_CONTROLLED_STORAGE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/storage/in_memory_storage.h"
#include "server/storage/storage.h"

namespace gradsync::testing {

class ControlledStorage final : public Storage {
 public:
  // With `open` false, batches wait in Apply until Open().
  explicit ControlledStorage(bool open = true) : open_(open) {}

  absl::Status Put(absl::string_view key, absl::string_view value) override {
    if (Failing()) return absl::UnavailableError("disk gone");
    return inner_.Put(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key) const override {
    return inner_.Get(key);
  }
  absl::StatusOr<bool> Delete(absl::string_view key) override {
    if (Failing()) return absl::UnavailableError("disk gone");
    return inner_.Delete(key);
  }
  absl::StatusOr<std::vector<Entry>> Scan(absl::string_view prefix,
                                          bool keys_only) const override {
    return inner_.Scan(prefix, keys_only);
  }
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override {
    if (Failing()) return absl::UnavailableError("disk gone");
    return inner_.DeletePrefix(prefix);
  }
  absl::Status Apply(const std::vector<Mutation>& batch) override {
    {
      absl::MutexLock lock(&mu_);
      ++entered_;
      mu_.Await(absl::Condition(&open_));
      if (!held_prefix_.empty() && PutsUnder(batch, held_prefix_)) {
        ++held_;
        mu_.Await(absl::Condition(&released_));
      }
      batches_.push_back(batch.size());
      if (failing_) return absl::UnavailableError("disk gone");
      if (!refused_prefix_.empty() && PutsUnder(batch, refused_prefix_)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "refused '", FirstPutUnder(batch, refused_prefix_), "'"));
      }
      if (!fail_next_.ok()) {
        absl::Status failed = fail_next_;
        fail_next_ = absl::OkStatus();
        return failed;
      }
    }
    return inner_.Apply(batch);
  }

  // The gate batches wait at.
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  // Every write fails while set.
  void SetFailing(bool failing) {
    absl::MutexLock lock(&mu_);
    failing_ = failing;
  }
  // Batches that put a key starting with `prefix` fail, as etcd refuses a
  // value over its limit (empty: none).
  void RefusePutsUnder(std::string prefix) {
    absl::MutexLock lock(&mu_);
    refused_prefix_ = std::move(prefix);
  }
  // Batches that put a key starting with `prefix` wait in Apply until
  // Release(); AwaitHeld(n) waits until n of them are waiting.
  void HoldPutsUnder(std::string prefix) {
    absl::MutexLock lock(&mu_);
    held_prefix_ = std::move(prefix);
    released_ = false;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_prefix_.clear();
    released_ = true;
  }
  void AwaitHeld(int n) const {
    absl::MutexLock lock(&mu_);
    auto held = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return held_ >= n;
    };
    mu_.Await(absl::Condition(&held));
  }
  // The next batch fails ("disk full", or with `status`).
  void FailNext(absl::Status status = absl::ResourceExhaustedError("disk full")) {
    absl::MutexLock lock(&mu_);
    fail_next_ = std::move(status);
  }
  // Batches that have entered Apply, held or not; waiting for `n` of them.
  int entered() const {
    absl::MutexLock lock(&mu_);
    return entered_;
  }
  void AwaitEntered(int n) const {
    absl::MutexLock lock(&mu_);
    auto entered = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return entered_ >= n;
    };
    mu_.Await(absl::Condition(&entered));
  }
  // The sizes of the batches that passed the gate, committed or failed, in
  // order.
  std::vector<size_t> batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }

 private:
  // The first key of `batch` put under `prefix`; empty when none is.
  static std::string FirstPutUnder(const std::vector<Mutation>& batch,
                                   absl::string_view prefix) {
    for (const Mutation& m : batch) {
      if (m.kind == Mutation::Kind::kPut && absl::StartsWith(m.key, prefix)) {
        return m.key;
      }
    }
    return "";
  }
  static bool PutsUnder(const std::vector<Mutation>& batch,
                        absl::string_view prefix) {
    return !FirstPutUnder(batch, prefix).empty();
  }

  bool Failing() const {
    absl::MutexLock lock(&mu_);
    return failing_;
  }

  InMemoryStorage inner_;
  mutable absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_);
  bool failing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fail_next_ ABSL_GUARDED_BY(mu_);
  std::string refused_prefix_ ABSL_GUARDED_BY(mu_);
  std::string held_prefix_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = true;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> batches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_CONTROLLED_STORAGE_H_
