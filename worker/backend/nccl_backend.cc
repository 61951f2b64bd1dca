#include "worker/backend/nccl_backend.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

constexpr char kUniqueIdKey[] = "nccl/unique_id";
// How often the watchdog looks for asynchronous errors and timeouts: a
// query per interval, nothing measurable; what it finds is a failure whose
// collective never completes (the completion thread sees the others).
constexpr absl::Duration kWatchdogInterval = absl::Milliseconds(100);
// A non-blocking call that is still in progress is polled from this pause,
// doubling up to kSettlePollMax.
constexpr absl::Duration kSettlePollMin = absl::Microseconds(20);
constexpr absl::Duration kSettlePollMax = absl::Milliseconds(2);

// An argument error, named as the backend's: a finished Work that
// consumes no sequence number.
std::shared_ptr<Work> Invalid(const absl::Status& status) {
  return Work::Done(0, absl::Status(status.code(),
                                    absl::StrCat("nccl ", status.message())));
}

// CheckBuffer, and for a device buffer also that it is on `device`: a
// communicator reads and writes only its own GPU's memory.
absl::Status CheckOnDevice(const Buffer& buffer, const NcclDevice& device,
                           const char* what) {
  absl::Status valid = CheckBuffer(buffer, device.buffer_kind(), what);
  if (valid.ok() && buffer.device == DeviceKind::kCuda &&
      buffer.device_index != device.index()) {
    valid = absl::InvalidArgumentError(
        absl::StrCat(what, ": buffer is on cuda:", buffer.device_index,
                     ", the communicator on ", device.name()));
  }
  return valid;
}

}  // namespace

// A collective's Work with its end event, which it owns: a caller's stream
// can wait on it (SynchronizeStream) for as long as the Work is held.
class NcclBackend::EndedWork final : public Work {
 public:
  EndedWork(uint64_t sequence, NcclDevice* device, void* stream)
      : Work(sequence), device_(device), stream_(stream) {}
  ~EndedWork() override {
    if (start_ != nullptr) device_->DestroyEvent(start_);
    if (end_ != nullptr) device_->DestroyEvent(end_);
  }

  // Once each, before the Work is handed out: the collective's start and
  // end on `stream` (timing events).
  absl::Status RecordStart(void* stream) {
    GS_ASSIGN_OR_RETURN(start_, device_->CreateEvent(/*timing=*/true));
    return device_->RecordEvent(start_, stream);
  }
  absl::Status RecordEnd(void* stream) {
    GS_ASSIGN_OR_RETURN(end_, device_->CreateEvent(/*timing=*/true));
    return device_->RecordEvent(end_, stream);
  }
  void* end() const { return end_; }

  // Once the end is done: the run time, from the device's own events,
  // ending now.
  void SetRunTimeFromEvents() {
    const absl::Time now = absl::Now();
    absl::StatusOr<absl::Duration> ran = device_->ElapsedTime(start_, end_);
    SetRunTime(ran.ok() ? now - *ran : now, now);
  }

  // Queues the wait on the device. The Work's own status (Wait) is what
  // says whether the collective succeeded: a caller that commits on the
  // data must check it.
  absl::Status SynchronizeStream(void* stream,
                                 absl::Duration timeout) const override {
    (void)timeout;  // the device waits; the watchdog bounds the collective
    if (IsCompleted()) return status();
    return device_->StreamWaitEvent(stream, end_);
  }

  void* stream() const override { return stream_; }

 private:
  NcclDevice* const device_;
  void* const stream_;
  void* start_ = nullptr;
  void* end_ = nullptr;
};

NcclBackend::NcclBackend(const BackendOptions& options,
                         const NcclOptions& nccl_options)
    : Backend(options),
      nccl_options_(nccl_options),
      device_(nccl_options.device) {}

absl::StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::Create(
    const BackendOptions& options, const NcclOptions& nccl_options) {
  GS_RETURN_IF_ERROR(CheckBackendOptions(options, "nccl backend"));
  if (nccl_options.device == nullptr) {
    return absl::InvalidArgumentError("nccl backend: no device");
  }
  return std::unique_ptr<NcclBackend>(new NcclBackend(options, nccl_options));
}

NcclBackend::~NcclBackend() {
  {
    absl::MutexLock lock(&mu_);
    // A healthy communicator with nothing pending finishes its work; one
    // with collectives still in flight (a peer gone) is aborted, and the
    // completion thread fails them once the device has ended them.
    if (!aborted_ && !pending_.empty()) {
      AbortLocked(absl::CancelledError("the nccl backend was destroyed"));
    }
    stopping_ = true;
  }
  if (completion_.joinable()) completion_.join();
  if (watchdog_.joinable()) watchdog_.join();
  std::unique_ptr<NcclComm> comm;
  bool healthy = false;
  {
    absl::MutexLock lock(&mu_);
    comm = std::move(comm_);
    healthy = !aborted_;
  }
  if (comm != nullptr && healthy && comm_stream_ != nullptr) {
    // Let what the stream holds (an empty collective's end, say) finish.
    absl::StatusOr<void*> drained = device_->CreateEvent(/*timing=*/false);
    if (drained.ok()) {
      if (device_->RecordEvent(*drained, comm_stream_).ok()) {
        device_->SynchronizeEvent(*drained).IgnoreError();
      }
      device_->DestroyEvent(*drained);
    }
  }
  comm.reset();
  if (barrier_buffer_ != nullptr) device_->Free(barrier_buffer_);
  if (ready_event_ != nullptr) device_->DestroyEvent(ready_event_);
  if (comm_stream_ != nullptr) device_->DestroyStream(comm_stream_);
}

void NcclBackend::Abort() {
  absl::MutexLock lock(&mu_);
  if (!aborted_) AbortLocked(absl::AbortedError("aborted by its owner"));
}

absl::Status NcclBackend::AllocateResources() {
  GS_RETURN_IF_ERROR(device_->MakeCurrent());
  GS_ASSIGN_OR_RETURN(comm_stream_, device_->CreateStream());
  GS_ASSIGN_OR_RETURN(ready_event_, device_->CreateEvent(/*timing=*/false));
  GS_ASSIGN_OR_RETURN(barrier_buffer_, device_->Allocate(sizeof(float)));
  return absl::OkStatus();
}

absl::Status NcclBackend::Connect(Store* store) {
  const absl::Time deadline = absl::Now() + options().timeout;
  GS_RETURN_IF_ERROR(AllocateResources());
  std::string id;
  if (rank() == 0) {
    GS_ASSIGN_OR_RETURN(id, device_->NewUniqueId());
    GS_RETURN_IF_ERROR(store->Set(kUniqueIdKey, id));
  } else {
    GS_ASSIGN_OR_RETURN(id, store->Get(kUniqueIdKey, options().timeout));
  }
  GS_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> comm,
                      device_->StartComm(id, world_size(), rank()));
  if (nccl_options_.faults) {
    comm = InjectCommFaults(std::move(comm), device_, nccl_options_.faults);
  }
  {
    absl::MutexLock lock(&mu_);
    comm_ = std::move(comm);
    if (aborted_) {  // Abort() came while the id was exchanged
      comm_->Abort();
      return abort_status_;
    }
  }
  absl::Status settled = AwaitSettled(
      absl::StrCat("communicator creation on ", device_->name()), deadline);
  if (!settled.ok()) {
    absl::MutexLock lock(&mu_);
    if (!aborted_) AbortLocked(settled);
    return settled;
  }
  completion_ = std::thread([this] { CompletionLoop(); });
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  return absl::OkStatus();
}

std::shared_ptr<Work> NcclBackend::AllReduce(Buffer buffer, ReduceOp op) {
  return Launch("allreduce", buffer, [&](NcclComm* comm, void* stream) {
    return comm->AllReduce(buffer.data, buffer.data, buffer.count,
                           buffer.dtype, op, stream);
  });
}

std::shared_ptr<Work> NcclBackend::Broadcast(Buffer buffer, int root) {
  absl::Status valid = CheckRoot(root, world_size());
  if (!valid.ok()) return Invalid(valid);
  return Launch("broadcast", buffer, [&](NcclComm* comm, void* stream) {
    return comm->Broadcast(buffer.data, buffer.data, buffer.count,
                           buffer.dtype, root, stream);
  });
}

std::shared_ptr<Work> NcclBackend::AllGather(Buffer input, Buffer output) {
  absl::Status valid = CheckOnDevice(input, *device_, "allgather");
  if (valid.ok()) valid = CheckOnDevice(output, *device_, "allgather output");
  if (valid.ok()) valid = CheckAllGatherSizes(input, output, world_size());
  if (!valid.ok()) return Invalid(valid);
  return Launch("allgather", input, [&](NcclComm* comm, void* stream) {
    return comm->AllGather(input.data, output.data, input.count, input.dtype,
                           stream);
  });
}

std::shared_ptr<Work> NcclBackend::Barrier() {
  Buffer one{barrier_buffer_, 1, DataType::kFloat32, device_->buffer_kind(),
             device_->index()};
  return Launch("barrier", one, [&](NcclComm* comm, void* stream) {
    return comm->AllReduce(barrier_buffer_, barrier_buffer_, 1,
                           DataType::kFloat32, ReduceOp::kSum, stream);
  });
}

// Validates, then (in issue order) orders the collective after the
// caller's stream, enqueues it on the communication stream and hands the
// Work to the completion thread.
std::shared_ptr<Work> NcclBackend::Launch(const char* collective,
                                          const Buffer& buffer,
                                          const IssueFn& issue) {
  absl::Status valid = CheckOnDevice(buffer, *device_, collective);
  if (!valid.ok()) return Invalid(valid);
  absl::MutexLock issuing(&issue_mu_);
  uint64_t sequence = 0;
  std::string what;
  NcclComm* comm = nullptr;
  {
    absl::MutexLock lock(&mu_);
    sequence = ++sequence_;
    what = absl::StrCat(collective, " #", sequence, " (rank ", rank(), " of ",
                        world_size(), ", ", buffer.count, " ",
                        DataTypeName(buffer.dtype), " on ", device_->name(),
                        ")");
    if (comm_ == nullptr) {
      return Work::Done(sequence, absl::FailedPreconditionError(absl::StrCat(
                                      "nccl ", what,
                                      ": the backend is not connected")));
    }
    if (aborted_) {
      return Work::Done(
          sequence,
          absl::AbortedError(absl::StrCat(
              "nccl ", what,
              ": the communicator was aborted after an earlier error (",
              abort_status_.message(),
              "); the round must be re-formed with a new one")));
    }
    comm = comm_.get();
  }
  auto work = std::make_shared<EndedWork>(sequence, device_, comm_stream_);
  absl::Status enqueued = Enqueue(buffer, issue, comm, work.get());
  absl::MutexLock lock(&mu_);
  if (!enqueued.ok()) {  // nothing of it reached the device
    return Work::Done(sequence,
                      absl::Status(enqueued.code(),
                                   absl::StrCat("nccl ", what, ": ",
                                                enqueued.message())));
  }
  // On the device now: pending until its end event is done, also when the
  // communicator was aborted meanwhile (the completion thread then fails
  // it), since until then the device may still use its buffer.
  pending_.push_back(Pending{work, absl::Now(), std::move(what)});
  return work;
}

absl::Status NcclBackend::Enqueue(const Buffer& buffer, const IssueFn& issue,
                                  NcclComm* comm, EndedWork* work) {
  GS_RETURN_IF_ERROR(device_->MakeCurrent());
  void* caller = buffer.stream != nullptr ? buffer.stream
                                          : nccl_options_.compute_stream;
  GS_RETURN_IF_ERROR(device_->RecordEvent(ready_event_, caller));
  GS_RETURN_IF_ERROR(device_->StreamWaitEvent(comm_stream_, ready_event_));
  GS_RETURN_IF_ERROR(work->RecordStart(comm_stream_));
  if (buffer.count > 0) {
    const absl::Status issued = issue(comm, comm_stream_);
    if (!issued.ok()) {  // not queued
      absl::MutexLock lock(&mu_);
      if (!aborted_) AbortLocked(issued);
      return issued;
    }
    // Queued: whether or not the enqueue settles, the collective ends on
    // the stream, at its end event.
    const absl::Status settled =
        AwaitSettled("enqueue", absl::Now() + options().timeout);
    if (!settled.ok()) {
      absl::MutexLock lock(&mu_);
      if (!aborted_) AbortLocked(settled);
    }
  }
  // An empty collective moves nothing but still ends in issue order.
  return work->RecordEnd(comm_stream_);
}

absl::Status NcclBackend::AwaitSettled(const std::string& what,
                                       absl::Time deadline) {
  NcclComm* comm = nullptr;
  {
    absl::MutexLock lock(&mu_);
    comm = comm_.get();
  }
  absl::Duration pause = kSettlePollMin;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return abort_status_;
    }
    absl::StatusOr<bool> settled = comm->Settled();
    if (!settled.ok()) return settled.status();
    if (*settled) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "NCCL ", what, " of rank ", rank(), " of ", world_size(),
          " did not complete within ", absl::FormatDuration(options().timeout),
          ": check that every rank started and can reach the others"));
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, kSettlePollMax);
  }
}

// Finishes each pending Work once its end event is done: OK when the
// communicator reports no error, else (and after an abort) with the error.
// The host learns a collective's outcome here, never before the device has
// finished with it, so a caller may free its buffer once Wait() returns,
// also after an abort.
void NcclBackend::CompletionLoop() {
  device_->MakeCurrent().IgnoreError();
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !pending_.empty();
    };
    mu_.Await(absl::Condition(&wake));
    if (pending_.empty()) return;  // stopping
    std::shared_ptr<EndedWork> work = pending_.front().work;
    mu_.Unlock();
    const absl::Status ended = device_->SynchronizeEvent(work->end());
    mu_.Lock();
    if (!aborted_ && !ended.ok()) AbortLocked(ended);
    if (!aborted_) {
      const absl::StatusOr<bool> settled = comm_->Settled();
      if (!settled.ok()) AbortLocked(settled.status());
    }
    const Pending done = std::move(pending_.front());
    pending_.pop_front();
    if (aborted_) {
      done.work->Finish(absl::Status(
          abort_status_.code(),
          absl::StrCat("nccl ", done.what, ": ", abort_status_.message())));
      continue;
    }
    done.work->SetRunTimeFromEvents();
    done.work->Finish(absl::OkStatus());
  }
}

// Aborts on an asynchronous error or a collective older than the timeout.
void NcclBackend::WatchdogLoop() {
  device_->MakeCurrent().IgnoreError();
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), kWatchdogInterval);
    if (stopping_ || aborted_ || pending_.empty()) continue;
    absl::StatusOr<bool> settled = comm_->Settled();
    if (!settled.ok()) {
      AbortLocked(settled.status());
      continue;
    }
    const Pending& front = pending_.front();
    if (absl::Now() - front.start > options().timeout) {
      AbortLocked(absl::DeadlineExceededError(absl::StrCat(
          "nccl ", front.what, " did not complete within ",
          absl::FormatDuration(options().timeout),
          ": a rank may have died, hung or issued different collectives; the "
          "communicator was aborted")));
    }
  }
}

void NcclBackend::AbortLocked(absl::Status status) {
  GS_LOG(ERROR) << "nccl rank " << rank() << " of " << world_size() << " on "
                << device_->name() << ": aborting the communicator: " << status;
  aborted_ = true;
  abort_status_ = status;
  // Ends the collectives in flight on the device; the completion thread
  // fails their Works as each one's end event is reached.
  if (comm_ != nullptr) comm_->Abort();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    const BackendOptions& options, Store* store,
    const NcclOptions& nccl_options) {
  GS_ASSIGN_OR_RETURN(std::unique_ptr<NcclBackend> backend,
                      NcclBackend::Create(options, nccl_options));
  GS_RETURN_IF_ERROR(backend->Connect(store));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace gradsync
