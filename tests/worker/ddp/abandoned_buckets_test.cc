// A step that fails leaves no gradient collective running into the buckets:
// a wait that timed out, and the buckets launched after it, or launched
// before the step failed for a parameter without a gradient, are ended
// (Backend::Settle aborts the backend) before the buckets are reused or
// freed. Over a scripted backend whose collectives never complete, so
// every wait times out; ScriptedBackend counts the aborts.
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/scripted_backend.h"
#include "worker/ddp/reducer.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Two parameters, `a` and `b`, of 4 floats: one bucket each, b's first
// (buckets take parameters in reverse registration order).
class AbandonedBucketsTest : public ::testing::Test {
 protected:
  AbandonedBucketsTest() {
    for (int i = 0; i < 2; ++i) {
      params_.push_back(torch::ones({4}, torch::requires_grad()));
    }
    ReducerOptions options;
    options.first_bucket_bytes = 16;
    options.bucket_cap_bytes = 16;
    options.timeout = absl::Milliseconds(5);
    reducer_.emplace(std::vector<std::string>{"a", "b"}, params_, &backend_,
                     options);
  }

  // A synchronized backward of `loss`; the error it raised ("" if none).
  std::string Backward(const torch::Tensor& loss) {
    reducer_->PrepareForBackward(/*sync=*/true, absl::ZeroDuration(),
                                 /*divisor=*/1);
    try {
      loss.backward();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  }

  testing::ScriptedBackend backend_;
  std::vector<torch::Tensor> params_;
  std::optional<Reducer> reducer_;
};

TEST_F(AbandonedBucketsTest,
       AWaitThatTimedOutEndsItsCollectiveAndTheLaterOnes) {
  ASSERT_EQ(reducer_->bucket_assignment().size(), 2u);
  EXPECT_THAT(Backward((params_[0] * params_[1]).sum()),
              HasSubstr("all-reduce of gradient bucket 0 of 2 failed"));
  ASSERT_EQ(backend_.works.size(), 2u) << "both buckets launched";
  // One abort for bucket 0's wait, one for bucket 1 (drained).
  EXPECT_EQ(backend_.aborts.load(), 2)
      << "the failed step returned with its collectives still running";
}

// Only b gets a gradient: its bucket (the first) is launched, then the step
// fails for `a` before any bucket is waited for.
TEST_F(AbandonedBucketsTest, TheNextStepEndsWhatAFailedStepLaunched) {
  EXPECT_THAT(Backward(params_[1].sum()),
              HasSubstr("parameter(s) a received no gradient"));
  ASSERT_EQ(backend_.works.size(), 1u);
  EXPECT_EQ(backend_.aborts.load(), 0) << "nothing waited for yet";
  reducer_->PrepareForBackward(/*sync=*/true, absl::ZeroDuration(), 1);
  EXPECT_GE(backend_.aborts.load(), 1)
      << "the next step would reuse a bucket still reduced into";
}

TEST_F(AbandonedBucketsTest, TheReducerEndsWhatAFailedStepLaunched) {
  EXPECT_THAT(Backward(params_[1].sum()),
              HasSubstr("parameter(s) a received no gradient"));
  reducer_.reset();
  EXPECT_GE(backend_.aborts.load(), 1)
      << "the buckets were freed with a collective still running";
}

}  // namespace
}  // namespace gradsync
