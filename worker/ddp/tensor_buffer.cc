#include "worker/ddp/tensor_buffer.h"

#ifdef GRADSYNC_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<Buffer> ToBuffer(const at::Tensor& tensor) {
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError("collectives need contiguous tensors");
  }
  Buffer buffer;
  buffer.data = tensor.data_ptr();
  buffer.count = static_cast<size_t>(tensor.numel());
  switch (tensor.scalar_type()) {
    case at::kFloat:
      buffer.dtype = DataType::kFloat32;
      break;
    case at::kDouble:
      buffer.dtype = DataType::kFloat64;
      break;
    case at::kHalf:
      buffer.dtype = DataType::kFloat16;
      break;
    case at::kBFloat16:
      buffer.dtype = DataType::kBFloat16;
      break;
    case at::kInt:
      buffer.dtype = DataType::kInt32;
      break;
    case at::kLong:
      buffer.dtype = DataType::kInt64;
      break;
    case at::kByte:
    case at::kBool:
      buffer.dtype = DataType::kUInt8;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors of dtype ", c10::toString(tensor.scalar_type()),
          " cannot be communicated: cast them to float32, float64, float16, "
          "bfloat16, int32, int64, uint8 or bool first"));
  }
  if (tensor.is_cuda()) {
    buffer.device = DeviceKind::kCuda;
    buffer.device_index = tensor.get_device();
    buffer.stream = CurrentStream(tensor);
  }
  return buffer;
}

void* CurrentStream(const at::Tensor& tensor) {
#ifdef GRADSYNC_TORCH_CUDA
  if (tensor.is_cuda()) {
    return c10::cuda::getCurrentCUDAStream(tensor.get_device()).stream();
  }
#endif
  (void)tensor;
  return nullptr;
}

void RecordStream(const at::Tensor& tensor, const Work& work) {
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

std::vector<c10::Device> FutureDevices(
    const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const at::Tensor& tensor : tensors) {
    if (tensor.is_cuda() && std::find(devices.begin(), devices.end(),
                                      tensor.device()) == devices.end()) {
      devices.push_back(tensor.device());
    }
  }
  return devices;
}

void RunOnWorkStream(const Work& work, int device_index,
                     const std::function<void()>& fn) {
#ifdef GRADSYNC_TORCH_CUDA
  if (device_index >= 0 && work.stream() != nullptr) {
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(
        static_cast<cudaStream_t>(work.stream()),
        static_cast<c10::DeviceIndex>(device_index)));
    fn();
    return;
  }
#endif
  (void)work;
  (void)device_index;
  fn();
}

}  // namespace gradsync
