// Comparing models' states in tests: the relative error of tensors, and of
// two parameter files entry by entry.
#ifndef GRADSYNC_TESTS_WORKER_DDP_STATE_COMPARE_H_
#define GRADSYNC_TESTS_WORKER_DDP_STATE_COMPARE_H_

#include <torch/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "worker/ddp/state_dict.h"

namespace gradsync {

// |actual - expected| / max(|expected|, 1e-12), in the Frobenius norm, in
// float64 (integer buffers included).
double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected);

// The largest RelativeError over the entries of `actual` and `expected`
// (after dropping a "module." prefix from either); FAILED_PRECONDITION when
// they do not hold the same names and shapes. `what` names the worst entry.
absl::StatusOr<double> MaxRelativeError(const StateDict& actual,
                                        const StateDict& expected,
                                        std::string* what = nullptr);
// The same for two parameter files (ReadStateDict's errors first).
absl::StatusOr<double> MaxRelativeError(const std::string& actual_path,
                                        const std::string& expected_path,
                                        std::string* what = nullptr);

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_WORKER_DDP_STATE_COMPARE_H_
