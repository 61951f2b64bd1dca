#include "worker/ddp/tensor_digest.h"

#include <ATen/ATen.h>

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// The tensor's elements as integers of their own size.
at::ScalarType BitsType(const at::Tensor& t) {
  switch (t.element_size()) {
    case 1:
      return at::kByte;
    case 2:
      return at::kShort;
    case 4:
      return at::kInt;
    default:
      return at::kLong;
  }
}

// The sum of `t`'s bit patterns, as a one-element int64 tensor on its
// device (not synchronized).
at::Tensor BitSum(const at::Tensor& t) {
  at::Tensor c = t.detach().contiguous();
  if (c.numel() == 0) return at::zeros({1}, c.options().dtype(at::kLong));
  // Detached: nothing for autograd to record. Summed in the elements' own
  // width (wrapping: a flipped bit still changes it), which vectorizes;
  // widened to int64 after.
  const at::ScalarType bits = BitsType(c);
  return c.view(bits).sum(bits).to(at::kLong).reshape({1});
}

}  // namespace

absl::StatusOr<ReplicaDigest> DigestTensors(std::vector<std::string> names,
                                            const std::vector<at::Tensor>& tensors) {
  if (names.size() != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a replica digest takes one name per tensor: ", names.size(),
        " names for ", tensors.size(), " tensors"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", names[i], "' of a replica digest is undefined"));
    }
  }
  try {
    ReplicaDigest digest;
    digest.names = std::move(names);
    if (tensors.empty()) return digest;
    std::vector<at::Tensor> sums;
    sums.reserve(tensors.size());
    bool one_device = true;
    for (const at::Tensor& t : tensors) {
      sums.push_back(BitSum(t));
      one_device = one_device && sums.back().device() == sums.front().device();
    }
    // One copy to the host when the tensors share a device.
    if (!one_device) {
      for (at::Tensor& s : sums) s = s.to(at::kCPU);
    }
    at::Tensor all = at::cat(sums).to(at::kCPU);
    const int64_t* p = all.data_ptr<int64_t>();
    digest.values.assign(p, p + all.numel());
    return digest;
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace gradsync
