// A communication backend (process group): collectives over the ranks of one
// round. Backends see raw buffers, never tensors, so LibTorch stays out of
// this layer; algorithms (the reducer) never see a transport.
#ifndef GRADSYNC_WORKER_BACKEND_BACKEND_H_
#define GRADSYNC_WORKER_BACKEND_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/backend/work.h"

namespace gradsync {

enum class DataType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };

// Bytes per element.
size_t DataTypeSize(DataType dtype);
// "float32", "int64", ...
std::string DataTypeName(DataType dtype);

enum class ReduceOp {
  kSum,
  // Sum divided by the world size (integers: truncated).
  kAverage,
};

enum class DeviceKind { kCpu, kCuda };

// A contiguous buffer of `count` elements of `dtype`. Does not own `data`;
// it must stay valid until the collective using it has completed.
struct Buffer {
  void* data = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  DeviceKind device = DeviceKind::kCpu;
  int device_index = 0;
  // CUDA: the stream (a cudaStream_t) the caller queued the buffer's
  // producers on; the collective runs after that work. nullptr: the
  // backend's own compute stream (NcclOptions::compute_stream).
  void* stream = nullptr;

  size_t bytes() const { return count * DataTypeSize(dtype); }
};

// Settings every backend takes.
struct BackendOptions {
  int rank = 0;
  int world_size = 1;
  // A collective that has not completed after this long fails (and, for
  // NCCL, aborts the communicator) instead of hanging.
  absl::Duration timeout = absl::Minutes(30);
};

// Collectives run asynchronously, in the order they are issued, and return
// a Work. Every rank must issue the same collectives in the same order. A
// collective a backend does not implement returns a Work finished with
// UNIMPLEMENTED naming the backend and the collective; bad arguments give
// INVALID_ARGUMENT. Thread-safe unless a backend says otherwise; a backend
// lives as long as the round it serves.
class Backend {
 public:
  explicit Backend(const BackendOptions& options) : options_(options) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // "gloo", "nccl".
  virtual std::string name() const = 0;

  // Whether Work::SynchronizeStream only orders a device stream after the
  // collective, the host going on (NCCL): the stream's later work may then
  // read a collective's result before the host knows that it failed, so a
  // caller that reads it there keeps it free of uninitialized memory and
  // checks the Work (Wait) before committing. False for host backends,
  // whose SynchronizeStream waits and returns the collective's status.
  virtual bool stream_ordered() const { return false; }

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const BackendOptions& options() const { return options_; }

  // In place: every rank's `buffer` ends holding the element-wise reduction
  // of all ranks' buffers.
  virtual std::shared_ptr<Work> AllReduce(Buffer buffer, ReduceOp op);
  // In place: every rank's `buffer` ends holding rank `root`'s.
  virtual std::shared_ptr<Work> Broadcast(Buffer buffer, int root);
  // `output` (world_size * input.count elements) ends holding every rank's
  // `input`, in rank order.
  virtual std::shared_ptr<Work> AllGather(Buffer input, Buffer output);
  // Completes once every rank has entered the barrier.
  virtual std::shared_ptr<Work> Barrier();

  // Fails the collective in flight and every later one, promptly, and makes
  // peers in a collective with this rank fail too: for a caller on another
  // thread (the runtime told by the coordinator that the round is over, a
  // watchdog) whose training thread may be blocked in a collective that
  // will never complete. The backend is unusable afterwards; destroy it.
  // Thread-safe and idempotent.
  virtual void Abort() = 0;

  // Waits at most `timeout` for `work`, one of this backend's collectives,
  // and returns its status (DEADLINE_EXCEEDED when the wait timed out).
  // A collective still running then is ended first (Settle), so that the
  // caller may free the buffers it uses: the Work of a wait that timed out
  // goes on, and a late peer's data, or the device, would write into freed
  // memory.
  absl::Status Await(const Work& work, absl::Duration timeout);

  // Ends `work` when it is still running: aborts this backend (a collective
  // out of step ends the round anyway) and waits at most `timeout` for it
  // to end. Nothing when it has ended.
  void Settle(const Work& work, absl::Duration timeout);

 protected:
  // A finished Work with UNIMPLEMENTED for `collective`.
  std::shared_ptr<Work> Unsupported(const char* collective) const;

 private:
  const BackendOptions options_;
};

// Argument checks shared by backends; INVALID_ARGUMENT naming the problem.
// CheckBackendOptions: a rank of a positive world size and a positive
// timeout; messages start with `backend` ("gloo backend: rank 2 is not in
// [0, 2)").
absl::Status CheckBackendOptions(const BackendOptions& options,
                                 const char* backend);
absl::Status CheckBuffer(const Buffer& buffer, DeviceKind expected_device,
                         const char* what);
absl::Status CheckRoot(int root, int world_size);
absl::Status CheckAllGatherSizes(const Buffer& input, const Buffer& output,
                                 int world_size);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_BACKEND_BACKEND_H_
