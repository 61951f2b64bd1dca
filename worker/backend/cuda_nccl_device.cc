#include "worker/backend/cuda_nccl_device.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// How long a healthy communicator's finalization may take before it is
// aborted instead.
constexpr absl::Duration kFinalizeBound = absl::Seconds(10);

absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so later calls can succeed
  return absl::InternalError(absl::StrCat("CUDA ", call, " failed: ",
                                          cudaGetErrorName(error), ": ",
                                          cudaGetErrorString(error)));
}

#define GS_CUDA(call) CudaStatus((call), #call)

absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm,
                        const char* call) {
  if (result == ncclSuccess || result == ncclInProgress) {
    return absl::OkStatus();
  }
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  std::string message = absl::StrCat(
      "NCCL ", call, " failed: ", ncclGetErrorString(result),
      detail != nullptr && *detail != '\0' ? absl::StrCat(" (", detail, ")")
                                           : std::string());
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<ncclDataType_t> NcclType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUInt8:
      return ncclUint8;
  }
  return absl::InvalidArgumentError("unknown dtype");
}

// The communicator handle under a mutex, so that Abort (which frees it) can
// race the watchdog's queries and an enqueue: each call holds the mutex for
// the duration of one non-blocking NCCL call.
class CudaNcclComm final : public NcclComm {
 public:
  CudaNcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  // A healthy communicator is finalized first (for a non-blocking one that
  // may be in progress: polled, at most kFinalizeBound, else aborted), then
  // destroyed.
  ~CudaNcclComm() override {
    absl::MutexLock lock(&mu_);
    if (comm_ == nullptr) return;
    cudaSetDevice(device_);
    ncclResult_t state = ncclCommFinalize(comm_);
    const absl::Time deadline = absl::Now() + kFinalizeBound;
    while (state == ncclInProgress && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  absl::StatusOr<bool> Settled() override {
    absl::MutexLock lock(&mu_);
    if (comm_ == nullptr) {
      return absl::AbortedError("the NCCL communicator was aborted");
    }
    ncclResult_t state = ncclSuccess;
    GS_RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm_, &state), comm_,
                                  "ncclCommGetAsyncError"));
    if (state == ncclInProgress) return false;
    GS_RETURN_IF_ERROR(NcclStatus(state, comm_, "asynchronous operation"));
    return true;
  }

  void Abort() override {
    absl::MutexLock lock(&mu_);
    if (comm_ == nullptr) return;
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  absl::Status AllReduce(const void* send, void* recv, size_t count,
                         DataType dtype, ReduceOp op, void* stream) override {
    GS_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
    absl::MutexLock lock(&mu_);
    GS_RETURN_IF_ERROR(CheckLive());
    return NcclStatus(
        ncclAllReduce(send, recv, count, type,
                      op == ReduceOp::kSum ? ncclSum : ncclAvg, comm_,
                      static_cast<cudaStream_t>(stream)),
        comm_, "ncclAllReduce");
  }

  absl::Status Broadcast(const void* send, void* recv, size_t count,
                         DataType dtype, int root, void* stream) override {
    GS_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
    absl::MutexLock lock(&mu_);
    GS_RETURN_IF_ERROR(CheckLive());
    return NcclStatus(ncclBroadcast(send, recv, count, type, root, comm_,
                                    static_cast<cudaStream_t>(stream)),
                      comm_, "ncclBroadcast");
  }

  absl::Status AllGather(const void* send, void* recv, size_t count,
                         DataType dtype, void* stream) override {
    GS_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
    absl::MutexLock lock(&mu_);
    GS_RETURN_IF_ERROR(CheckLive());
    return NcclStatus(ncclAllGather(send, recv, count, type, comm_,
                                    static_cast<cudaStream_t>(stream)),
                      comm_, "ncclAllGather");
  }

 private:
  absl::Status CheckLive() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (comm_ == nullptr) {
      return absl::AbortedError("the NCCL communicator was aborted");
    }
    return GS_CUDA(cudaSetDevice(device_));
  }

  absl::Mutex mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_);
  const int device_;
};

// The streams of every CudaNcclDevice of this process, never destroyed:
// PyTorch's caching allocator remembers each stream a tensor was used on
// (recordStream) and, when the tensor is freed, possibly long after the
// backend that made the stream is gone, records an event on it; on a
// destroyed stream that fails ("CUDA error: context is destroyed", thrown
// from a tensor's destructor: seen on an H200). So, as PyTorch's own stream
// pool does, a stream lives for the process: DestroyStream hands it back
// here and CreateStream takes a free one of its device before making one.
// A reused stream runs new work after the work already queued on it.
// Thread-safe; leaked on purpose (streams may be used until the process
// ends).
class StreamPool {
 public:
  static StreamPool& Get() {
    static StreamPool* pool = new StreamPool;
    return *pool;
  }

  // A free stream of `device` (the current device), or nullptr.
  cudaStream_t Take(int device) {
    absl::MutexLock lock(&mu_);
    std::vector<cudaStream_t>& free = free_[device];
    if (free.empty()) return nullptr;
    cudaStream_t stream = free.back();
    free.pop_back();
    return stream;
  }
  void Give(int device, cudaStream_t stream) {
    absl::MutexLock lock(&mu_);
    free_[device].push_back(stream);
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<int, std::vector<cudaStream_t>> free_
      ABSL_GUARDED_BY(mu_);
};

class CudaNcclDevice final : public NcclDevice {
 public:
  explicit CudaNcclDevice(int index) : index_(index) {}

  std::string name() const override { return absl::StrCat("cuda:", index_); }
  int index() const override { return index_; }
  DeviceKind buffer_kind() const override { return DeviceKind::kCuda; }

  // Every call below that reaches the CUDA runtime makes this device
  // current first: it may come from a thread that never set one (the
  // telemetry and heartbeat threads, a Work released on them), where the
  // runtime would otherwise use, and make a context on, device 0. That is
  // another process's GPU for every local rank but 0.
  absl::Status MakeCurrent() override { return GS_CUDA(cudaSetDevice(index_)); }

  // Streams come from and go back to the process's StreamPool (above).
  absl::StatusOr<void*> CreateStream() override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    cudaStream_t stream = StreamPool::Get().Take(index_);
    if (stream == nullptr) {
      GS_RETURN_IF_ERROR(
          GS_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
    }
    return static_cast<void*>(stream);
  }
  void DestroyStream(void* stream) override {
    StreamPool::Get().Give(index_, static_cast<cudaStream_t>(stream));
  }

  absl::StatusOr<void*> CreateEvent(bool timing) override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    cudaEvent_t event = nullptr;
    GS_RETURN_IF_ERROR(GS_CUDA(cudaEventCreateWithFlags(
        &event,
        cudaEventBlockingSync | (timing ? 0u : cudaEventDisableTiming))));
    return static_cast<void*>(event);
  }
  absl::StatusOr<absl::Duration> ElapsedTime(void* start, void* end) override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    float ms = 0;
    GS_RETURN_IF_ERROR(GS_CUDA(cudaEventElapsedTime(
        &ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end))));
    return absl::Microseconds(static_cast<int64_t>(ms * 1000.0));
  }
  void DestroyEvent(void* event) override {
    MakeCurrent().IgnoreError();
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  absl::Status RecordEvent(void* event, void* stream) override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    return GS_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event),
                                   static_cast<cudaStream_t>(stream)));
  }
  absl::StatusOr<bool> EventDone(void* event) override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    const cudaError_t query = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (query == cudaErrorNotReady) return false;
    GS_RETURN_IF_ERROR(CudaStatus(query, "cudaEventQuery"));
    return true;
  }
  absl::Status SynchronizeEvent(void* event) override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    return GS_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
  absl::Status StreamWaitEvent(void* stream, void* event) override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    return GS_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                       static_cast<cudaEvent_t>(event), 0));
  }
  absl::Status LaunchHostFunction(void* stream,
                                  std::function<void()> fn) override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    auto* owned = new std::function<void()>(std::move(fn));
    const cudaError_t launched = cudaLaunchHostFunc(
        static_cast<cudaStream_t>(stream),
        [](void* data) {
          auto* f = static_cast<std::function<void()>*>(data);
          (*f)();
          delete f;
        },
        owned);
    if (launched != cudaSuccess) delete owned;
    return CudaStatus(launched, "cudaLaunchHostFunc");
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    GS_RETURN_IF_ERROR(MakeCurrent());
    void* data = nullptr;
    GS_RETURN_IF_ERROR(GS_CUDA(cudaMalloc(&data, bytes)));
    return data;
  }
  void Free(void* data) override {
    MakeCurrent().IgnoreError();
    cudaFree(data);
  }

  // Not restoring the thread's device before: that was device 0 on a
  // thread that never set one, and setting it back made a context there.
  int64_t MemoryInUse() override {
    size_t free_bytes = 0, total_bytes = 0;
    const bool ok = MakeCurrent().ok() &&
                    cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
    if (!ok) {
      cudaGetLastError();
      return 0;
    }
    return static_cast<int64_t>(total_bytes - free_bytes);
  }

  absl::StatusOr<std::string> NewUniqueId() override {
    ncclUniqueId id;
    GS_RETURN_IF_ERROR(
        NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
    return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
  }

  absl::StatusOr<std::unique_ptr<NcclComm>> StartComm(
      const std::string& unique_id, int world_size, int rank) override {
    if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
      return absl::DataLossError(absl::StrCat(
          "the NCCL unique id has ", unique_id.size(), " bytes, expected ",
          NCCL_UNIQUE_ID_BYTES, ": are all ranks using the same NCCL version?"));
    }
    ncclUniqueId id;
    std::copy(unique_id.begin(), unique_id.end(), id.internal);
    GS_RETURN_IF_ERROR(MakeCurrent());
    // Non-blocking, so that a rank that never arrives cannot hang the
    // caller, and Abort() can end the creation.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t result =
        ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      absl::Status failed = NcclStatus(result, comm, "ncclCommInitRankConfig");
      if (comm != nullptr) ncclCommAbort(comm);
      return failed;
    }
    return std::unique_ptr<NcclComm>(new CudaNcclComm(comm, index_));
  }

 private:
  const int index_;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<NcclDevice>> CreateCudaNcclDevice(int index) {
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    return absl::FailedPreconditionError(
        "the nccl backend needs a CUDA device and this process sees none: "
        "use the gloo backend on CPU, or --device=sim to simulate one");
  }
  if (index < 0 || index >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA device ", index, " does not exist (", devices, " visible)"));
  }
  return std::unique_ptr<NcclDevice>(new CudaNcclDevice(index));
}

}  // namespace gradsync
