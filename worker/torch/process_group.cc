#include "worker/torch/process_group.h"

#include <unistd.h>

#include <exception>
#include <stdexcept>
#include <utility>

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include "absl/strings/str_cat.h"
#include "worker/backend/gloo_backend.h"
#include "worker/backend/shm_backend.h"
#include "worker/ddp/tensor_buffer.h"

namespace gradsync {
namespace {

// Throws (torch surfaces it as RuntimeError) unless `status` is OK.
void ThrowIfError(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    throw std::runtime_error(
        absl::StrCat("gradsync process group: ", what, ": ", status.ToString()));
  }
}

absl::StatusOr<DataType> ToDataType(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kByte: return DataType::kUInt8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensors of ", c10::toString(type), " are not supported"));
  }
}

// The buffer of a dense, contiguous tensor on the CPU or a CUDA device; a
// CUDA tensor's collective runs after the work queued on its device's
// current stream (the backend checks that it takes tensors there).
// `copy_only`: for a collective that only moves bytes (broadcast,
// allgather), which also takes the 1-byte types no reduction does (bool,
// as DDP's buffer broadcast sends a model's masks, and int8) as uint8.
Buffer BufferOf(const at::Tensor& tensor, const char* what,
                bool copy_only = false) {
  if (!tensor.is_contiguous() || tensor.is_sparse() ||
      !(tensor.device().is_cpu() || tensor.device().is_cuda())) {
    ThrowIfError(absl::InvalidArgumentError(
                     "tensors must be dense, contiguous and on the CPU or a "
                     "CUDA device"),
                 what);
  }
  at::ScalarType type = tensor.scalar_type();
  if (copy_only && (type == at::kBool || type == at::kChar)) type = at::kByte;
  absl::StatusOr<DataType> dtype = ToDataType(type);
  ThrowIfError(dtype.status(), what);
  Buffer buffer;
  buffer.data = tensor.data_ptr();
  buffer.count = static_cast<size_t>(tensor.numel());
  buffer.dtype = *dtype;
  if (tensor.is_cuda()) {
    buffer.device = DeviceKind::kCuda;
    buffer.device_index = tensor.get_device();
    buffer.stream = CurrentStream(tensor);
  }
  return buffer;
}

// The CUDA device of a collective's tensors (the first one's), or -1.
int CudaDeviceOf(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& tensor : tensors) {
    if (tensor.is_cuda()) return tensor.get_device();
  }
  return -1;
}

// `refused` (a backend's INVALID_ARGUMENT), naming the ways to CUDA when a
// host backend refused CUDA tensors.
absl::Status WithCudaHint(const absl::Status& refused,
                          const std::string& backend,
                          const std::vector<at::Tensor>& tensors) {
  if (CudaDeviceOf(tensors) < 0 || backend == "nccl") return refused;
  return absl::InvalidArgumentError(absl::StrCat(
      refused.message(), " (this group's ", backend,
      " backend carries CPU tensors; for CUDA tensors use the groups of "
      "gradsync.elastic.run(..., device=\"cuda\"), which run NCCL, or "
      "torch.distributed's \"nccl\" backend)"));
}

// The one tensor of a single-device collective's list.
const at::Tensor& OnlyTensor(const std::vector<at::Tensor>& tensors,
                             const char* what) {
  if (tensors.size() != 1) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
                     "takes one tensor per call, got ", tensors.size())),
                 what);
  }
  return tensors[0];
}

// A c10d::Work over the future a TorchProcessGroup completes.
class FutureWork final : public c10d::Work {
 public:
  FutureWork(int rank, c10d::OpType type, std::shared_ptr<gradsync::Work> work,
             c10::intrusive_ptr<c10::ivalue::Future> future)
      : c10d::Work(rank, type), work_(std::move(work)), future_(std::move(future)) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override {
    return future_->completed() && !future_->hasError();
  }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr()
                                                       : nullptr;
  }
  std::vector<at::Tensor> result() override {
    return future_->value().toTensorVector();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout != ::kNoTimeout) {
      const absl::Status done = work_->Wait(absl::FromChrono(timeout));
      if (absl::IsDeadlineExceeded(done) && !work_->IsCompleted()) {
        ThrowIfError(done, "wait");
      }
    }
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  const std::shared_ptr<gradsync::Work> work_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

struct TorchProcessGroup::Pending {
  const char* collective;
  std::shared_ptr<Work> work;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> keep;
  std::function<void()> finish;
  int cuda_device;  // of the tensors; -1: on the CPU
};

TorchProcessGroup::TorchProcessGroup(std::unique_ptr<Backend> backend,
                                     BlockingWait blocking_wait)
    : c10d::ProcessGroup(backend->rank(), backend->world_size()),
      owned_(std::move(backend)),
      backend_(owned_.get()),
      blocking_wait_(std::move(blocking_wait)),
      transport_(backend_->name()),
      completer_([this] { CompleteLoop(); }) {}

TorchProcessGroup::TorchProcessGroup(Backend* backend)
    : c10d::ProcessGroup(backend->rank(), backend->world_size()),
      backend_(backend),
      transport_(backend_->name()),
      completer_([this] { CompleteLoop(); }) {}

TorchProcessGroup::~TorchProcessGroup() { End(); }

void TorchProcessGroup::End() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    // A collective still to complete (queued, or the one the completing
    // thread waits for) would keep End() waiting: it is aborted.
    if (!pending_.empty() || completing_) backend_->Abort();
  }
  const auto join = [this] { completer_.join(); };
  if (blocking_wait_) {
    blocking_wait_(join);
  } else {
    join();
  }
}

void TorchProcessGroup::Abort() {
  absl::MutexLock lock(&mu_);  // End() cannot pass while the backend aborts
  if (!stopping_) backend_->Abort();
}

absl::Status TorchProcessGroup::first_failure() const {
  absl::MutexLock lock(&mu_);
  return first_failure_;
}

void TorchProcessGroup::CheckLive(const char* collective) const {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    ThrowIfError(absl::FailedPreconditionError(
                     "the round of this process group is over: use the "
                     "next round's group"),
                 collective);
  }
}

c10::intrusive_ptr<c10d::Work> TorchProcessGroup::Track(
    const char* collective, c10d::OpType type, std::shared_ptr<Work> work,
    std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
    std::function<void()> finish) {
  // Arguments the backend refused (a tensor on a device it does not take)
  // fail the call itself, as torch's own groups do.
  if (work->IsCompleted() && absl::IsInvalidArgument(work->status())) {
    ThrowIfError(WithCudaHint(work->status(), backend_->name(), outputs),
                 collective);
  }
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), FutureDevices(outputs));
  auto tracked = c10::make_intrusive<FutureWork>(getRank(), type, work, future);
  const int cuda_device = CudaDeviceOf(outputs);
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      pending_.push_back(std::make_unique<Pending>(
          Pending{collective, std::move(work), future, std::move(outputs),
                  std::move(keep), std::move(finish), cuda_device}));
      return tracked;
    }
  }
  // End() came between CheckLive and here: its completing thread is gone.
  // The collective is aborted and waited for before its tensors go.
  backend_->Abort();
  work->Wait().IgnoreError();
  future->setError(std::make_exception_ptr(std::runtime_error(absl::StrCat(
      "gradsync process group: ", collective,
      ": the round of this process group is over: use the next round's "
      "group"))));
  return tracked;
}

void TorchProcessGroup::CompleteLoop() {
  const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.empty() || stopping_;
  };
  for (;;) {
    std::unique_ptr<Pending> next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&ready));
      if (pending_.empty()) return;  // stopping, every collective completed
      next = std::move(pending_.front());
      pending_.pop_front();
      completing_ = true;
    }
    const absl::Status status = next->work->Wait();
    {
      absl::MutexLock lock(&mu_);
      completing_ = false;
      if (!status.ok() && first_failure_.ok()) first_failure_ = status;
    }
    if (!status.ok()) {
      next->future->setError(std::make_exception_ptr(std::runtime_error(
          absl::StrCat("gradsync process group: ", next->collective, " #",
                       next->work->sequence(), " (", transport_,
                       ", rank ", getRank(), " of ", getSize(),
                       "): ", status.ToString()))));
      continue;
    }
    // On a GPU the collective is done on the device by now; what follows
    // (a copy out, the future's events) is queued on its stream, and the
    // allocator keeps the tensors' memory until that ran.
    RunOnWorkStream(*next->work, next->cuda_device, [&] {
      try {
        if (next->finish) next->finish();
      } catch (const std::exception& e) {  // e.g. a copy out torch refused
        next->future->setError(std::make_exception_ptr(std::runtime_error(
            absl::StrCat("gradsync process group: ", next->collective, ": ",
                         e.what()))));
        return;
      }
      for (const at::Tensor& tensor : next->keep)
        RecordStream(tensor, *next->work);
      next->future->markCompleted(c10::IValue(next->outputs));
    });
  }
}

c10::intrusive_ptr<c10d::Work> TorchProcessGroup::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  CheckLive("broadcast");
  const at::Tensor& tensor = OnlyTensor(tensors, "broadcast");
  return Track("broadcast", c10d::OpType::BROADCAST,
               backend_->Broadcast(BufferOf(tensor, "broadcast", true),
                                   static_cast<int>(opts.rootRank)),
               tensors, {});
}

c10::intrusive_ptr<c10d::Work> TorchProcessGroup::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  CheckLive("allreduce");
  const at::Tensor& tensor = OnlyTensor(tensors, "allreduce");
  ReduceOp op = ReduceOp::kSum;
  if (opts.reduceOp.op_ == c10d::ReduceOp::AVG) {
    op = ReduceOp::kAverage;
  } else if (opts.reduceOp.op_ != c10d::ReduceOp::SUM) {
    ThrowIfError(absl::InvalidArgumentError(
                     "only SUM and AVG reductions are supported"),
                 "allreduce");
  }
  return Track("allreduce", c10d::OpType::ALLREDUCE,
               backend_->AllReduce(BufferOf(tensor, "allreduce"), op), tensors,
               {});
}

c10::intrusive_ptr<c10d::Work> TorchProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  CheckLive("allgather");
  const at::Tensor& input = OnlyTensor(inputs, "allgather");
  if (outputs.size() != 1 ||
      outputs[0].size() != static_cast<size_t>(getSize())) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
                     "takes one list of ", getSize(), " output tensors")),
                 "allgather");
  }
  for (const at::Tensor& out : outputs[0]) {
    if (out.numel() != input.numel() || out.scalar_type() != input.scalar_type()) {
      ThrowIfError(absl::InvalidArgumentError(
                       "every output tensor must match the input's size and "
                       "type"),
                   "allgather");
    }
  }
  // Into one flat tensor, then copied out to the caller's tensors.
  at::Tensor flat = at::empty({getSize() * input.numel()}, input.options());
  std::vector<at::Tensor> targets = outputs[0];
  std::function<void()> copy_out = [flat, targets]() mutable {
    for (size_t r = 0; r < targets.size(); ++r) {
      // copy_ takes a strided target (a transposed view, unbind's parts).
      targets[r].copy_(
          flat.narrow(0, r * targets[r].numel(), targets[r].numel())
              .view(targets[r].sizes()));
    }
  };
  return Track("allgather", c10d::OpType::ALLGATHER,
               backend_->AllGather(BufferOf(input, "allgather", true),
                                   BufferOf(flat, "allgather", true)),
               outputs[0], {input, flat}, std::move(copy_out));
}

c10::intrusive_ptr<c10d::Work> TorchProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  CheckLive("allgather");
  return Track("allgather", c10d::OpType::_ALLGATHER_BASE,
               backend_->AllGather(BufferOf(input, "allgather", true),
                                   BufferOf(output, "allgather", true)),
               {output}, {input});
}

c10::intrusive_ptr<c10d::Work> TorchProcessGroup::barrier(
    const c10d::BarrierOptions& opts) {
  CheckLive("barrier");
  return Track("barrier", c10d::OpType::BARRIER, backend_->Barrier(), {}, {});
}

absl::StatusOr<c10::intrusive_ptr<TorchProcessGroup>> CreateTorchProcessGroup(
    Store* store, int rank, int world_size, const TorchGroupOptions& options) {
  BackendOptions backend_options;
  backend_options.rank = rank;
  backend_options.world_size = world_size;
  backend_options.timeout = options.timeout;
  absl::Status valid = CheckBackendOptions(backend_options, "gradsync");
  if (!valid.ok()) return valid;
  char hostname[256] = {};
  gethostname(hostname, sizeof(hostname) - 1);
  absl::Status set = store->Set(absl::StrCat("gradsync/host/", rank), hostname);
  if (!set.ok()) return set;
  bool one_host = options.shared_memory;
  for (int r = 0; r < world_size && one_host; ++r) {
    absl::StatusOr<std::string> host =
        store->Get(absl::StrCat("gradsync/host/", r), options.timeout);
    if (!host.ok()) return host.status();
    one_host = *host == hostname;
  }
  std::unique_ptr<Backend> backend;
  if (one_host) {
    absl::StatusOr<std::unique_ptr<ShmBackend>> shm =
        ShmBackend::Create(backend_options, store);
    if (!shm.ok()) return shm.status();
    backend = *std::move(shm);
  } else {
    GlooOptions gloo;
    gloo.hostname = options.gloo_address;
    absl::StatusOr<std::unique_ptr<GlooBackend>> tcp =
        GlooBackend::Create(backend_options, store, gloo);
    if (!tcp.ok()) return tcp.status();
    backend = *std::move(tcp);
  }
  return c10::make_intrusive<TorchProcessGroup>(std::move(backend),
                                                options.blocking_wait);
}

}  // namespace gradsync
