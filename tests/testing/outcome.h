// Records the result of an asynchronous call whose callback may run inline
// or later, on any thread.
#ifndef GRADSYNC_TESTS_TESTING_OUTCOME_H_
#define GRADSYNC_TESTS_TESTING_OUTCOME_H_

#include <functional>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

// `Result` is absl::Status or absl::StatusOr<T>. Thread-safe; must outlive
// the callback it hands out.
template <typename Result>
class Outcome {
 public:
  std::function<void(Result)> Callback() {
    return [this](Result result) {
      absl::MutexLock lock(&mu_);
      result_ = std::move(result);
      ++calls_;
    };
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return calls_ > 0;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // The result; UNKNOWN while the call has not finished.
  Result result() const {
    absl::MutexLock lock(&mu_);
    if (!result_.has_value()) {
      return Result(absl::UnknownError("the call has not finished"));
    }
    return *result_;
  }

 private:
  mutable absl::Mutex mu_;
  std::optional<Result> result_;
  int calls_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_OUTCOME_H_
