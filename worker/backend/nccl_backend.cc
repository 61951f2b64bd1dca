#include "worker/backend/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

constexpr char kUniqueIdKey[] = "nccl/unique_id";
// How often the watchdog looks at pending collectives and async errors.
constexpr absl::Duration kWatchdogPoll = absl::Microseconds(50);
constexpr absl::Duration kWatchdogIdle = absl::Milliseconds(100);

// CUDA errors become a status at the call site, naming the call.
absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", call, " failed: ",
                                          cudaGetErrorName(error), ": ",
                                          cudaGetErrorString(error)));
}

absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm,
                        const std::string& call) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* detail = ncclGetLastError(comm);
  std::string message =
      absl::StrCat("NCCL ", call, " failed: ", ncclGetErrorString(result),
                   detail != nullptr && *detail != '\0'
                       ? absl::StrCat(" (", detail, ")")
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

#define GS_RETURN_IF_CUDA_ERROR(call) GS_RETURN_IF_ERROR(CudaStatus((call), #call))

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

// A collective's Work with its end event, which it owns: a caller's stream
// can wait on it (SynchronizeStream) for as long as the Work is held.
class NcclWork final : public Work {
 public:
  explicit NcclWork(uint64_t sequence) : Work(sequence) {}
  ~NcclWork() override {
    if (end_ != nullptr) cudaEventDestroy(end_);
  }

  // Set once, before the Work is handed out.
  absl::Status CreateEnd(cudaStream_t stream) {
    GS_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&end_, cudaEventDisableTiming));
    return CudaStatus(cudaEventRecord(end_, stream), "cudaEventRecord");
  }
  cudaEvent_t end() const { return end_; }

  absl::Status SynchronizeStream(void* stream,
                                 absl::Duration timeout) const override {
    (void)timeout;  // the GPU waits; the watchdog bounds the collective
    if (IsCompleted()) return status();
    return CudaStatus(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), end_, 0),
        "cudaStreamWaitEvent");
  }

 private:
  cudaEvent_t end_ = nullptr;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(const BackendOptions& options, const NcclOptions& nccl_options)
      : Backend(options), nccl_options_(nccl_options) {}

  ~NcclBackend() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    cudaSetDevice(nccl_options_.device_index);
    {
      absl::MutexLock lock(&mu_);
      // A healthy communicator finishes its work; a broken one is aborted.
      if (comm_ != nullptr && aborted_) {
        ncclCommAbort(comm_);
      } else if (comm_ != nullptr) {
        cudaStreamSynchronize(comm_stream_);
        ncclCommDestroy(comm_);
      }
      comm_ = nullptr;
      FailPendingLocked(absl::CancelledError("the nccl backend was destroyed"));
    }
    if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
    if (ready_event_ != nullptr) cudaEventDestroy(ready_event_);
    if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
  }

  std::string name() const override { return "nccl"; }

  // ncclCommAbort, as the watchdog does on an error.
  void Abort() override {
    absl::MutexLock lock(&mu_);
    if (!aborted_) AbortLocked(absl::AbortedError("aborted by its owner"));
  }

  absl::Status Init(Store* store) {
    GS_RETURN_IF_CUDA_ERROR(cudaSetDevice(nccl_options_.device_index));
    GS_RETURN_IF_CUDA_ERROR(
        cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    GS_RETURN_IF_CUDA_ERROR(
        cudaEventCreateWithFlags(&ready_event_, cudaEventDisableTiming));
    GS_RETURN_IF_CUDA_ERROR(cudaMalloc(&barrier_buffer_, sizeof(float)));

    ncclUniqueId id;
    if (rank() == 0) {
      GS_RETURN_IF_ERROR(
          NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
      GS_RETURN_IF_ERROR(store->Set(
          kUniqueIdKey, std::string(id.internal, NCCL_UNIQUE_ID_BYTES)));
    } else {
      GS_ASSIGN_OR_RETURN(std::string bytes,
                          store->Get(kUniqueIdKey, options().timeout));
      if (bytes.size() != NCCL_UNIQUE_ID_BYTES) {
        return absl::DataLossError(absl::StrCat(
            "the NCCL unique id in the store has ", bytes.size(),
            " bytes, expected ", NCCL_UNIQUE_ID_BYTES,
            ": are all ranks using the same NCCL version?"));
      }
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }

    // Non-blocking creation, so a missing rank cannot hang us forever.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result = ncclCommInitRankConfig(&comm_, world_size(), id,
                                                 rank(), &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      return NcclStatus(result, comm_, "ncclCommInitRankConfig");
    }
    absl::Status settled = AwaitSettled("communicator creation");
    if (!settled.ok()) {
      absl::MutexLock lock(&mu_);
      aborted_ = true;  // the destructor aborts the half-made communicator
      return settled;
    }
    watchdog_ = std::thread([this] { WatchdogLoop(); });
    return absl::OkStatus();
  }

  std::shared_ptr<Work> AllReduce(Buffer buffer, ReduceOp op) override {
    return Launch("allreduce", buffer, [&](ncclDataType_t type,
                                          cudaStream_t stream) {
      return ncclAllReduce(buffer.data, buffer.data, buffer.count, type,
                           op == ReduceOp::kSum ? ncclSum : ncclAvg, comm_,
                           stream);
    });
  }

  std::shared_ptr<Work> Broadcast(Buffer buffer, int root) override {
    absl::Status valid = CheckRoot(root, world_size());
    if (!valid.ok()) return Work::Done(0, valid);
    return Launch("broadcast", buffer, [&](ncclDataType_t type,
                                          cudaStream_t stream) {
      return ncclBroadcast(buffer.data, buffer.data, buffer.count, type, root,
                           comm_, stream);
    });
  }

  std::shared_ptr<Work> AllGather(Buffer input, Buffer output) override {
    absl::Status valid = CheckBuffer(output, DeviceKind::kCuda, "allgather");
    if (valid.ok()) valid = CheckAllGatherSizes(input, output, world_size());
    if (!valid.ok()) return Work::Done(0, valid);
    return Launch("allgather", input, [&](ncclDataType_t type,
                                         cudaStream_t stream) {
      return ncclAllGather(input.data, output.data, input.count, type, comm_,
                           stream);
    });
  }

  std::shared_ptr<Work> Barrier() override {
    Buffer one{barrier_buffer_, 1, DataType::kFloat32, DeviceKind::kCuda,
               nccl_options_.device_index};
    return Launch("barrier", one, [&](ncclDataType_t type,
                                     cudaStream_t stream) {
      return ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, type, ncclSum,
                           comm_, stream);
    });
  }

 private:
  struct Pending {
    std::shared_ptr<NcclWork> work;
    absl::Time start;
    std::string what;  // "allreduce #17 (rank 2 of 4, 1048576 float32)"
  };

  // Validates, orders after the caller's stream (the buffer's, else the
  // compute stream), enqueues `op` on the comm stream and tracks its
  // completion.
  std::shared_ptr<Work> Launch(
      const char* collective, const Buffer& buffer,
      const std::function<ncclResult_t(ncclDataType_t, cudaStream_t)>& op) {
    absl::MutexLock lock(&mu_);
    const uint64_t sequence = ++sequence_;
    const std::string what = absl::StrCat(
        collective, " #", sequence, " (rank ", rank(), " of ", world_size(),
        ", ", buffer.count, " ", DataTypeName(buffer.dtype), ")");
    if (aborted_) {
      return Work::Done(sequence, absl::FailedPreconditionError(absl::StrCat(
                                      "nccl ", what,
                                      ": the communicator was aborted after "
                                      "an earlier error: ",
                                      abort_status_.message())));
    }
    absl::Status status = CheckBuffer(buffer, DeviceKind::kCuda, collective);
    absl::StatusOr<ncclDataType_t> type = NcclType(buffer.dtype);
    if (status.ok()) status = type.status();
    if (!status.ok() || buffer.count == 0) {
      return Work::Done(sequence, status);
    }
    Pending pending{std::make_shared<NcclWork>(sequence), absl::Now(), what};
    status = Enqueue(*type, op, buffer.stream, pending.work.get());
    if (!status.ok()) {
      return Work::Done(sequence, absl::Status(status.code(),
                                               absl::StrCat("nccl ", what,
                                                            ": ",
                                                            status.message())));
    }
    std::shared_ptr<Work> work = pending.work;
    pending_.push_back(std::move(pending));
    return work;
  }

  absl::Status Enqueue(
      ncclDataType_t type,
      const std::function<ncclResult_t(ncclDataType_t, cudaStream_t)>& op,
      void* caller_stream, NcclWork* work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    GS_RETURN_IF_CUDA_ERROR(cudaSetDevice(nccl_options_.device_index));
    auto compute = static_cast<cudaStream_t>(
        caller_stream != nullptr ? caller_stream : nccl_options_.compute_stream);
    GS_RETURN_IF_CUDA_ERROR(cudaEventRecord(ready_event_, compute));
    GS_RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(comm_stream_, ready_event_, 0));
    ncclResult_t result = op(type, comm_stream_);
    if (result == ncclInProgress) {
      absl::Status settled = AwaitSettled("enqueue");
      if (!settled.ok()) {
        AbortLocked(settled);
        return settled;
      }
    } else {
      GS_RETURN_IF_ERROR(NcclStatus(result, comm_, "collective"));
    }
    return work->CreateEnd(comm_stream_);
  }

  // Polls a non-blocking communicator until its last call has settled.
  absl::Status AwaitSettled(const char* what) {
    const absl::Time deadline = absl::Now() + options().timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      GS_RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm_, &state), comm_,
                                    "ncclCommGetAsyncError"));
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        return NcclStatus(state, comm_, what);
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "NCCL ", what, " of rank ", rank(), " of ", world_size(),
            " did not complete within ", absl::FormatDuration(options().timeout),
            ": check that every rank started and can reach the others"));
      }
      absl::SleepFor(kWatchdogPoll);
    }
  }

  // Completes finished collectives; aborts on async errors and timeouts.
  void WatchdogLoop() {
    cudaSetDevice(nccl_options_.device_index);
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      if (pending_.empty() || aborted_) {
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || (!pending_.empty() && !aborted_);
        };
        mu_.AwaitWithTimeout(absl::Condition(&wake), kWatchdogIdle);
      }
      if (stopping_ || aborted_) continue;
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        AbortLocked(NcclStatus(state, comm_, "asynchronous error"));
        continue;
      }
      while (!pending_.empty()) {
        Pending& front = pending_.front();
        cudaError_t query = cudaEventQuery(front.work->end());
        if (query == cudaSuccess) {
          front.work->Finish(absl::OkStatus());
          pending_.pop_front();
          continue;
        }
        if (query != cudaErrorNotReady) {
          AbortLocked(CudaStatus(query, "cudaEventQuery"));
        } else if (absl::Now() - front.start > options().timeout) {
          AbortLocked(absl::DeadlineExceededError(absl::StrCat(
              "nccl ", front.what, " did not complete within ",
              absl::FormatDuration(options().timeout),
              ": a rank may have died or issued different collectives; the "
              "communicator was aborted")));
        }
        break;
      }
      if (!pending_.empty()) {
        mu_.Unlock();
        absl::SleepFor(kWatchdogPoll);
        mu_.Lock();
      }
    }
  }

  void AbortLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    GS_LOG(ERROR) << "nccl rank " << rank() << " of " << world_size()
                  << ": aborting the communicator: " << status;
    aborted_ = true;
    abort_status_ = status;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    FailPendingLocked(status);
  }

  void FailPendingLocked(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (Pending& pending : pending_) {
      pending.work->Finish(absl::Status(
          status.code(), absl::StrCat("nccl ", pending.what, ": ",
                                      status.message())));
    }
    pending_.clear();
  }

  const NcclOptions nccl_options_;
  // Set in Init, then read-only (comm_ is nulled by an abort, under mu_).
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_event_ = nullptr;
  void* barrier_buffer_ = nullptr;
  std::thread watchdog_;

  absl::Mutex mu_;
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
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

int64_t CudaDeviceMemoryInUse(int device_index) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  size_t free_bytes = 0, total_bytes = 0;
  const bool ok = cudaSetDevice(device_index) == cudaSuccess &&
                  cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  cudaSetDevice(previous);
  if (!ok) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(total_bytes - free_bytes);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    const BackendOptions& options, Store* store,
    const NcclOptions& nccl_options) {
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    return absl::FailedPreconditionError(
        "the nccl backend needs a CUDA device and this process sees none: "
        "use the gloo backend on CPU");
  }
  if (nccl_options.device_index < 0 || nccl_options.device_index >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA device ", nccl_options.device_index, " does not exist (",
        devices, " visible)"));
  }
  auto backend = std::make_unique<NcclBackend>(options, nccl_options);
  absl::Status initialized = backend->Init(store);
  if (!initialized.ok()) return initialized;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace gradsync
