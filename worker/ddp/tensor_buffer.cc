#include "worker/ddp/tensor_buffer.h"

#ifdef GRADSYNC_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<Buffer> ToBuffer(const torch::Tensor& tensor) {
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError("collectives need contiguous tensors");
  }
  Buffer buffer;
  buffer.data = tensor.data_ptr();
  buffer.count = static_cast<size_t>(tensor.numel());
  switch (tensor.scalar_type()) {
    case torch::kFloat32:
      buffer.dtype = DataType::kFloat32;
      break;
    case torch::kFloat64:
      buffer.dtype = DataType::kFloat64;
      break;
    case torch::kFloat16:
      buffer.dtype = DataType::kFloat16;
      break;
    case torch::kBFloat16:
      buffer.dtype = DataType::kBFloat16;
      break;
    case torch::kInt32:
      buffer.dtype = DataType::kInt32;
      break;
    case torch::kInt64:
      buffer.dtype = DataType::kInt64;
      break;
    case torch::kUInt8:
    case torch::kBool:
      buffer.dtype = DataType::kUInt8;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors of dtype ", c10::toString(tensor.scalar_type()),
          " cannot be communicated"));
  }
  if (tensor.is_cuda()) {
    buffer.device = DeviceKind::kCuda;
    buffer.device_index = tensor.get_device();
    buffer.stream = CurrentStream(tensor);
  }
  return buffer;
}

void* CurrentStream(const torch::Tensor& tensor) {
#ifdef GRADSYNC_TORCH_CUDA
  if (tensor.is_cuda()) {
    return c10::cuda::getCurrentCUDAStream(tensor.get_device()).stream();
  }
#endif
  (void)tensor;
  return nullptr;
}

void RecordStream(const torch::Tensor& tensor, const Work& work) {
#ifdef GRADSYNC_TORCH_CUDA
  if (tensor.is_cuda() && work.stream() != nullptr) {
    c10::cuda::CUDACachingAllocator::recordStream(
        tensor.storage().data_ptr(),
        c10::cuda::getStreamFromExternal(
            static_cast<cudaStream_t>(work.stream()), tensor.get_device()));
  }
#endif
  (void)tensor;
  (void)work;
}

}  // namespace gradsync
