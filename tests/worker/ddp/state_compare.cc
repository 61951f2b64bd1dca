#include "tests/worker/ddp/state_compare.h"

#include <torch/torch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync {

double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected) {
  torch::Tensor a = actual.to(torch::kFloat64);
  torch::Tensor e = expected.to(torch::kFloat64);
  return (a - e).norm().item<double>() / std::max(e.norm().item<double>(), 1e-12);
}

absl::StatusOr<double> MaxRelativeError(const StateDict& actual_state,
                                        const StateDict& expected_state,
                                        std::string* what) {
  const StateDict actual = ConsumePrefix(actual_state, kDdpPrefix);
  const StateDict expected = ConsumePrefix(expected_state, kDdpPrefix);
  if (actual.size() != expected.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(actual.size(), " entries against ", expected.size()));
  }
  double worst = 0;
  for (const auto& item : expected) {
    const torch::Tensor* mine = actual.find(item.key());
    if (mine == nullptr || mine->sizes() != item.value().sizes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", item.key(), "' is missing or of another shape"));
    }
    const double error = RelativeError(*mine, item.value());
    if (error >= worst) {
      worst = error;
      if (what != nullptr) *what = item.key();
    }
  }
  return worst;
}

absl::StatusOr<double> MaxRelativeError(const std::string& actual_path,
                                        const std::string& expected_path,
                                        std::string* what) {
  GS_ASSIGN_OR_RETURN(StateDict actual, ReadStateDict(actual_path));
  GS_ASSIGN_OR_RETURN(StateDict expected, ReadStateDict(expected_path));
  return MaxRelativeError(actual, expected, what);
}

}  // namespace gradsync
