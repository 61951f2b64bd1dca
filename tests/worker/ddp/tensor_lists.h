// Lists of tensors in tests: copies that later changes cannot reach, and
// exact comparison.
#ifndef GRADSYNC_TESTS_WORKER_DDP_TENSOR_LISTS_H_
#define GRADSYNC_TESTS_WORKER_DDP_TENSOR_LISTS_H_

#include <torch/torch.h>

#include <vector>

namespace gradsync {
namespace testing {

// Detached clones of `tensors`.
inline std::vector<torch::Tensor> Copy(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  for (const torch::Tensor& t : tensors) copies.push_back(t.detach().clone());
  return copies;
}

// As many tensors, each equal (shape, dtype, every element) to its peer.
inline bool Equal(const std::vector<torch::Tensor>& a,
                  const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace testing
}  // namespace gradsync

#endif  // GRADSYNC_TESTS_WORKER_DDP_TENSOR_LISTS_H_
