#include "worker/backend/backend.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"

namespace gradsync {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kUInt8:
      return 1;
  }
  return 0;
}

std::string DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

std::shared_ptr<Work> Backend::AllReduce(Buffer, ReduceOp) {
  return Unsupported("allreduce");
}
std::shared_ptr<Work> Backend::Broadcast(Buffer, int) {
  return Unsupported("broadcast");
}
std::shared_ptr<Work> Backend::AllGather(Buffer, Buffer) {
  return Unsupported("allgather");
}
std::shared_ptr<Work> Backend::Barrier() { return Unsupported("barrier"); }

absl::Status Backend::Await(const Work& work, absl::Duration timeout) {
  const absl::Status status = work.Wait(timeout);
  Settle(work, timeout);
  return status;
}

void Backend::Settle(const Work& work, absl::Duration timeout) {
  if (work.IsCompleted()) return;
  GS_LOG(WARNING) << name() << " collective #" << work.sequence()
                  << " did not end in " << absl::FormatDuration(timeout)
                  << ": aborting the process group before its buffers go";
  Abort();
  work.Wait(timeout).IgnoreError();
  if (!work.IsCompleted()) {
    GS_LOG(ERROR) << name() << " collective #" << work.sequence()
                  << " still runs " << absl::FormatDuration(timeout)
                  << " after the abort";
  }
}

std::shared_ptr<Work> Backend::Unsupported(const char* collective) const {
  return Work::Done(0, absl::UnimplementedError(absl::StrCat(
                           "backend ", name(), " does not support ",
                           collective)));
}

absl::Status CheckBackendOptions(const BackendOptions& options,
                                 const char* backend) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        backend, ": world size ", options.world_size, " is not positive"));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(backend, ": rank ", options.rank, " is not in [0, ",
                     options.world_size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        backend, ": timeout ", absl::FormatDuration(options.timeout),
        " is not positive"));
  }
  return absl::OkStatus();
}

absl::Status CheckBuffer(const Buffer& buffer, DeviceKind expected_device,
                         const char* what) {
  if (buffer.data == nullptr && buffer.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": buffer of ", buffer.count,
                     " elements has no data pointer"));
  }
  if (buffer.device != expected_device) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": buffer is on ",
        buffer.device == DeviceKind::kCpu ? "cpu" : "cuda", ", expected ",
        expected_device == DeviceKind::kCpu ? "cpu" : "cuda"));
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(int root, int world_size) {
  if (root < 0 || root >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "broadcast root ", root, " is not a rank in [0, ", world_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckAllGatherSizes(const Buffer& input, const Buffer& output,
                                 int world_size) {
  if (input.dtype != output.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allgather: input is ", DataTypeName(input.dtype), ", output is ",
        DataTypeName(output.dtype)));
  }
  if (output.count != input.count * static_cast<size_t>(world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allgather: output holds ", output.count, " elements; needs ",
        input.count, " x ", world_size, " ranks"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
