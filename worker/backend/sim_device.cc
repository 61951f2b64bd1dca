#include "worker/backend/sim_device.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/backend/file_store.h"
#include "worker/backend/shm_backend.h"

namespace gradsync {
namespace {

constexpr int kDefaultSimDevices = 8;
// A collective waits for its peers this long in the shared-memory transport:
// longer than any test or job runs, so a hung peer is found by the NCCL
// backend's watchdog (its timeout, then an abort), as on a GPU.
constexpr absl::Duration kTransportTimeout = absl::Hours(24);
// Each rank's slot in the transport's segment (bigger collectives run in
// chunks of it).
constexpr size_t kTransportSlotBytes = size_t{1} << 20;

// A stream: a thread that runs what is queued on it, in order.
class SimStream {
 public:
  SimStream() : thread_([this] { Run(); }) {}
  // Runs what is queued, then stops.
  ~SimStream() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  void Enqueue(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }

 private:
  void Run() {
    absl::MutexLock lock(&mu_);
    for (;;) {
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&wake));
      if (queue_.empty()) return;  // stopping, nothing left
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      fn();
      mu_.Lock();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is ready
};

// An event: the number of records so far and the last one its stream has
// reached. Shared with the stream work that completes it.
struct SimEvent {
  absl::Mutex mu;
  uint64_t recorded ABSL_GUARDED_BY(mu) = 0;
  uint64_t completed ABSL_GUARDED_BY(mu) = 0;
  // When the last completion happened (host time stands for device time).
  absl::Time completed_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();

  void Complete(uint64_t n) {
    absl::MutexLock lock(&mu);
    if (n > completed) {
      completed = n;
      completed_at = absl::Now();
    }
  }
  uint64_t Target() {
    absl::MutexLock lock(&mu);
    return recorded;
  }
  void WaitFor(uint64_t n) {
    absl::MutexLock lock(&mu);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return completed >= n;
    };
    mu.Await(absl::Condition(&reached));
  }
};

// Removes the files of a communicator's bootstrap directory, then it.
void RemoveBootstrapDirectory(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* entry = readdir(d)) {
      if (std::strcmp(entry->d_name, ".") == 0 ||
          std::strcmp(entry->d_name, "..") == 0) {
        continue;
      }
      unlink(absl::StrCat(dir, "/", entry->d_name).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

// What a communicator shares with its creation thread and the collectives
// queued on streams, which may outlive it.
struct CommState {
  absl::Mutex mu;
  std::unique_ptr<ShmBackend> transport ABSL_GUARDED_BY(mu);
  bool ready ABSL_GUARDED_BY(mu) = false;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  // A failed creation, or the asynchronous error of a collective.
  absl::Status error ABSL_GUARDED_BY(mu);
  // Ends a creation waiting for peers.
  std::atomic<bool> cancel{false};

  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu);
    if (!aborted && error.ok()) error = std::move(status);
  }
};

// Connects rank `rank`'s transport through the directory `dir`.
void CreateTransport(const std::shared_ptr<CommState>& state,
                     const std::string& dir, int world_size, int rank) {
  FileStore store(dir, &state->cancel);
  BackendOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.timeout = kTransportTimeout;
  ShmOptions shm;
  shm.slot_bytes = kTransportSlotBytes;
  shm.cancel = &state->cancel;
  absl::StatusOr<std::unique_ptr<ShmBackend>> transport =
      ShmBackend::Create(options, &store, shm);
  // Every rank that got here read the segment's name (or gave up): the
  // directory is not needed any more.
  if (transport.ok() || rank == 0) RemoveBootstrapDirectory(dir);
  absl::MutexLock lock(&state->mu);
  if (state->aborted) return;
  if (!transport.ok()) {
    state->error = absl::Status(
        transport.status().code(),
        absl::StrCat("simulated NCCL communicator creation failed: ",
                     transport.status().message()));
    return;
  }
  state->transport = std::move(*transport);
  state->ready = true;
}

// A collective of a simulated communicator, as its stream runs it: over the
// transport, unless the communicator was aborted or failed already (then it
// ends at once, its output undefined, as an aborted kernel's).
void RunCollective(
    const std::shared_ptr<CommState>& state, const char* collective,
    const std::function<std::shared_ptr<Work>(ShmBackend*)>& start) {
  ShmBackend* transport = nullptr;
  {
    absl::MutexLock lock(&state->mu);
    if (state->aborted || !state->error.ok() || !state->ready) return;
    transport = state->transport.get();
  }
  absl::Status done = start(transport)->Wait();
  if (!done.ok()) {
    state->Fail(absl::UnavailableError(absl::StrCat(
        "simulated NCCL ", collective, " failed: ", done.message())));
  }
}

class SimComm final : public NcclComm {
 public:
  SimComm(NcclDevice* device, const std::string& dir, int world_size,
          int rank)
      : device_(device),
        world_size_(world_size),
        state_(std::make_shared<CommState>()) {
    creation_ = std::thread(CreateTransport, state_, dir, world_size, rank);
  }
  ~SimComm() override {
    state_->cancel.store(true);
    creation_.join();
  }

  absl::StatusOr<bool> Settled() override {
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted) {
      return absl::AbortedError("the simulated NCCL communicator was aborted");
    }
    if (!state_->error.ok()) return state_->error;
    return state_->ready;
  }

  void Abort() override {
    state_->cancel.store(true);
    absl::MutexLock lock(&state_->mu);
    if (state_->aborted) return;
    state_->aborted = true;
    if (state_->transport != nullptr) state_->transport->Abort();
  }

  absl::Status AllReduce(const void* send, void* recv, size_t count,
                         DataType dtype, ReduceOp op, void* stream) override {
    return Enqueue(stream, [=](ShmBackend* transport) {
      Copy(send, recv, count * DataTypeSize(dtype));
      return transport->AllReduce(HostBuffer(recv, count, dtype), op);
    }, "allreduce");
  }
  absl::Status Broadcast(const void* send, void* recv, size_t count,
                         DataType dtype, int root, void* stream) override {
    return Enqueue(stream, [=](ShmBackend* transport) {
      Copy(send, recv, count * DataTypeSize(dtype));
      return transport->Broadcast(HostBuffer(recv, count, dtype), root);
    }, "broadcast");
  }
  absl::Status AllGather(const void* send, void* recv, size_t count,
                         DataType dtype, void* stream) override {
    const size_t total = count * world_size_;
    return Enqueue(stream, [=](ShmBackend* transport) {
      return transport->AllGather(
          HostBuffer(const_cast<void*>(send), count, dtype),
          HostBuffer(recv, total, dtype));
    }, "allgather");
  }

 private:
  static Buffer HostBuffer(void* data, size_t count, DataType dtype) {
    Buffer buffer;
    buffer.data = data;
    buffer.count = count;
    buffer.dtype = dtype;
    return buffer;
  }
  static void Copy(const void* from, void* to, size_t bytes) {
    if (from != to) std::memmove(to, from, bytes);
  }

  absl::Status Enqueue(
      void* stream,
      std::function<std::shared_ptr<Work>(ShmBackend*)> start,
      const char* collective) {
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->aborted) {
        return absl::AbortedError(
            "the simulated NCCL communicator was aborted");
      }
      if (!state_->ready) {
        return absl::FailedPreconditionError(
            "the simulated NCCL communicator is not created yet");
      }
    }
    std::shared_ptr<CommState> state = state_;
    return device_->LaunchHostFunction(
        stream, [state, start = std::move(start), collective] {
          RunCollective(state, collective, start);
        });
  }

  NcclDevice* const device_;
  const int world_size_;
  const std::shared_ptr<CommState> state_;
  std::thread creation_;
};

class SimDevice final : public NcclDevice {
 public:
  explicit SimDevice(int index) : index_(index) {}
  ~SimDevice() override {
    absl::MutexLock lock(&mu_);
    streams_.clear();  // each runs what it holds, then stops
    for (auto& [data, bytes] : allocations_) std::free(data);
  }

  std::string name() const override { return absl::StrCat("sim:", index_); }
  int index() const override { return index_; }
  DeviceKind buffer_kind() const override { return DeviceKind::kCpu; }
  absl::Status MakeCurrent() override { return absl::OkStatus(); }

  absl::StatusOr<void*> CreateStream() override {
    auto stream = std::make_unique<SimStream>();
    void* handle = stream.get();
    absl::MutexLock lock(&mu_);
    streams_[handle] = std::move(stream);
    return handle;
  }
  void DestroyStream(void* stream) override {
    std::unique_ptr<SimStream> owned;
    {
      absl::MutexLock lock(&mu_);
      auto it = streams_.find(stream);
      if (it == streams_.end()) return;
      owned = std::move(it->second);
      streams_.erase(it);
    }
    owned.reset();  // outside the lock: it may wait for queued work
  }

  absl::StatusOr<void*> CreateEvent(bool timing) override {
    (void)timing;  // every simulated event keeps its completion time
    auto event = std::make_shared<SimEvent>();
    void* handle = event.get();
    absl::MutexLock lock(&mu_);
    events_[handle] = std::move(event);
    return handle;
  }
  void DestroyEvent(void* event) override {
    absl::MutexLock lock(&mu_);
    events_.erase(event);  // work queued on a stream keeps it alive
  }

  absl::Status RecordEvent(void* event, void* stream) override {
    GS_ASSIGN_OR_RETURN(std::shared_ptr<SimEvent> e, FindEvent(event));
    uint64_t n = 0;
    {
      absl::MutexLock lock(&e->mu);
      n = ++e->recorded;
    }
    return OnStream(stream, [e, n] { e->Complete(n); });
  }
  absl::StatusOr<absl::Duration> ElapsedTime(void* start, void* end) override {
    GS_ASSIGN_OR_RETURN(std::shared_ptr<SimEvent> s, FindEvent(start));
    GS_ASSIGN_OR_RETURN(std::shared_ptr<SimEvent> e, FindEvent(end));
    absl::Time from, to;
    bool done = false;
    {
      absl::MutexLock lock(&s->mu);
      from = s->completed_at;
      done = s->recorded > 0 && s->completed >= s->recorded;
    }
    {
      absl::MutexLock lock(&e->mu);
      to = e->completed_at;
      done = done && e->recorded > 0 && e->completed >= e->recorded;
    }
    if (!done) {
      return absl::FailedPreconditionError(
          absl::StrCat(name(), ": elapsed time between events not both done"));
    }
    return to - from;
  }
  absl::StatusOr<bool> EventDone(void* event) override {
    GS_ASSIGN_OR_RETURN(std::shared_ptr<SimEvent> e, FindEvent(event));
    absl::MutexLock lock(&e->mu);
    return e->completed >= e->recorded;
  }
  absl::Status SynchronizeEvent(void* event) override {
    GS_ASSIGN_OR_RETURN(std::shared_ptr<SimEvent> e, FindEvent(event));
    e->WaitFor(e->Target());
    return absl::OkStatus();
  }
  absl::Status StreamWaitEvent(void* stream, void* event) override {
    GS_ASSIGN_OR_RETURN(std::shared_ptr<SimEvent> e, FindEvent(event));
    const uint64_t target = e->Target();
    return OnStream(stream, [e, target] { e->WaitFor(target); });
  }
  absl::Status LaunchHostFunction(void* stream,
                                  std::function<void()> fn) override {
    return OnStream(stream, std::move(fn));
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* data = std::aligned_alloc(64, rounded);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          name(), ": cannot allocate ", bytes, " bytes of host memory"));
    }
    absl::MutexLock lock(&mu_);
    allocations_[data] = rounded;
    return data;
  }
  void Free(void* data) override {
    absl::MutexLock lock(&mu_);
    auto it = allocations_.find(data);
    if (it == allocations_.end()) return;
    std::free(data);
    allocations_.erase(it);
  }
  int64_t MemoryInUse() override {
    absl::MutexLock lock(&mu_);
    int64_t bytes = 0;
    for (const auto& [data, size] : allocations_) bytes += size;
    return bytes;
  }

  absl::StatusOr<std::string> NewUniqueId() override {
    return FileStore::MakeDirectory("gradsync-simnccl");
  }

  absl::StatusOr<std::unique_ptr<NcclComm>> StartComm(
      const std::string& unique_id, int world_size, int rank) override {
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          name(), ": rank ", rank, " is not in [0, ", world_size, ")"));
    }
    if (access(unique_id.c_str(), F_OK) != 0 && rank == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name(), ": '", unique_id,
          "' is not a simulated communicator's unique id"));
    }
    return std::unique_ptr<NcclComm>(
        new SimComm(this, unique_id, world_size, rank));
  }

 private:
  absl::StatusOr<std::shared_ptr<SimEvent>> FindEvent(void* event) {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(event);
    if (it == events_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": not an event of this device"));
    }
    return it->second;
  }

  // Runs `fn` when `stream` reaches it; on the null stream (the host) now.
  absl::Status OnStream(void* stream, std::function<void()> fn) {
    if (stream == nullptr) {
      fn();
      return absl::OkStatus();
    }
    SimStream* s = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = streams_.find(stream);
      if (it == streams_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name(), ": not a stream of this device"));
      }
      s = it->second.get();
    }
    s->Enqueue(std::move(fn));
    return absl::OkStatus();
  }

  const int index_;
  absl::Mutex mu_;
  std::map<void*, std::unique_ptr<SimStream>> streams_ ABSL_GUARDED_BY(mu_);
  std::map<void*, std::shared_ptr<SimEvent>> events_ ABSL_GUARDED_BY(mu_);
  std::map<void*, size_t> allocations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<int> SimDeviceCount() {
  const char* value = std::getenv("GRADSYNC_SIM_DEVICES");
  if (value == nullptr || *value == '\0') return kDefaultSimDevices;
  int count = 0;
  if (!absl::SimpleAtoi(value, &count) || count < 1 || count > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GRADSYNC_SIM_DEVICES must be a count of simulated devices per node "
        "in [1, 1024], got '", value, "'"));
  }
  return count;
}

absl::StatusOr<std::unique_ptr<NcclDevice>> CreateSimDevice(int index) {
  GS_ASSIGN_OR_RETURN(int count, SimDeviceCount());
  if (index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulated device ", index, " does not exist (", count,
        " per node; GRADSYNC_SIM_DEVICES sets how many)"));
  }
  return std::unique_ptr<NcclDevice>(new SimDevice(index));
}

}  // namespace gradsync
