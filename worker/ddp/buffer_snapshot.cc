#include "worker/ddp/buffer_snapshot.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace gradsync {

void BufferSnapshot::Take(const torch::nn::Module& module) {
  groups_.clear();
  for (const torch::Tensor& buffer : module.buffers(/*recurse=*/true)) {
    if (!buffer.defined() || buffer.numel() == 0) continue;
    Group* group = nullptr;
    for (Group& g : groups_) {
      if (g.buffers.front().device() == buffer.device() &&
          g.buffers.front().scalar_type() == buffer.scalar_type()) {
        group = &g;
        break;
      }
    }
    if (group == nullptr) group = &groups_.emplace_back();
    group->buffers.push_back(buffer);
  }
  c10::NoGradGuard no_grad;
  for (Group& group : groups_) {
    std::vector<torch::Tensor> flat;
    flat.reserve(group.buffers.size());
    for (const torch::Tensor& buffer : group.buffers) {
      flat.push_back(buffer.reshape({-1}));
    }
    group.values = at::cat(flat);  // a copy, also of a single buffer
  }
}

void BufferSnapshot::Restore() {
  c10::NoGradGuard no_grad;
  for (Group& group : groups_) {
    int64_t offset = 0;
    for (torch::Tensor& buffer : group.buffers) {
      buffer.copy_(
          group.values.narrow(0, offset, buffer.numel()).view(buffer.sizes()));
      offset += buffer.numel();
    }
  }
  groups_.clear();
}

}  // namespace gradsync
