// The NCCL backend on a real GPU, through CudaNcclDevice. Without a GPU only
// the "no device" behaviour runs; the rest skip (the backend's multi-rank
// logic is tested on the simulated device by nccl_backend_test). A single
// GPU runs world size 1 (NCCL refuses two ranks on one device), which still
// exercises the real layer: bootstrap, streams, events, host functions, the
// completion thread, the watchdog and every collective's plumbing.
#include "worker/backend/cuda_nccl_device.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/nccl_backend.h"
#include "worker/backend/nccl_faults.h"
#include "worker/backend/store.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

#define SKIP_WITHOUT_GPU()                                 \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

// A device copy of `host` that frees itself.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : count_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(1, count_) * sizeof(T)),
              cudaSuccess);
    if (count_ > 0) {
      EXPECT_EQ(cudaMemcpy(data_, host.data(), count_ * sizeof(T),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  ~DeviceVector() { cudaFree(data_); }
  std::vector<T> ToHost() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(T),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }
  Buffer buffer(DataType dtype) {
    return Buffer{data_, count_, dtype, DeviceKind::kCuda, 0};
  }

 private:
  void* data_ = nullptr;
  size_t count_;
};

// GPU 0, for the whole test process (a device outlives its backends).
NcclDevice* Gpu() {
  static NcclDevice* device = [] {
    auto created = CreateCudaNcclDevice(0);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? created->release() : nullptr;
  }();
  return device;
}

NcclOptions OnGpu() {
  NcclOptions options;
  options.device = Gpu();
  return options;
}

std::unique_ptr<Backend> MakeSingleRank() {
  InMemoryStore store;
  BackendOptions options;
  options.timeout = absl::Seconds(30);
  auto backend = CreateNcclBackend(options, &store, OnGpu());
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

TEST(NcclBackendTest, OpeningAGpuWithoutOneIsFailedPrecondition) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  auto device = CreateCudaNcclDevice(0);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(device.status().message(), HasSubstr("gloo"));
}

class NcclCollectivesTest : public ::testing::TestWithParam<size_t> {};

TEST_P(NcclCollectivesTest, SingleRankCollectivesKeepOrCopyTheData) {
  SKIP_WITHOUT_GPU();
  const size_t count = GetParam();
  std::unique_ptr<Backend> backend = MakeSingleRank();
  ASSERT_NE(backend, nullptr);
  std::vector<float> values(count);
  std::iota(values.begin(), values.end(), 1.0f);
  std::vector<int64_t> ints(count);
  std::iota(ints.begin(), ints.end(), int64_t{-3});

  DeviceVector<float> sum(values), avg(values), bcast(values), in(values),
      out(values);
  DeviceVector<int64_t> int_sum(ints);
  std::vector<std::shared_ptr<Work>> works = {
      backend->AllReduce(sum.buffer(DataType::kFloat32), ReduceOp::kSum),
      backend->AllReduce(avg.buffer(DataType::kFloat32), ReduceOp::kAverage),
      backend->AllReduce(int_sum.buffer(DataType::kInt64), ReduceOp::kSum),
      backend->Broadcast(bcast.buffer(DataType::kFloat32), 0),
      backend->AllGather(in.buffer(DataType::kFloat32),
                         out.buffer(DataType::kFloat32)),
      backend->Barrier(),
  };
  for (const auto& work : works) {
    ASSERT_TRUE(work->Wait(absl::Seconds(30)).ok()) << work->status();
  }
  EXPECT_EQ(sum.ToHost(), values);
  EXPECT_EQ(avg.ToHost(), values);
  EXPECT_EQ(int_sum.ToHost(), ints);
  EXPECT_EQ(bcast.ToHost(), values);
  EXPECT_EQ(out.ToHost(), values);
}

INSTANTIATE_TEST_SUITE_P(Counts, NcclCollectivesTest,
                         ::testing::Values(0, 1, 7, 1000, (1 << 20) + 3));

TEST(NcclBackendTest, ManyCollectivesBackToBackCompleteInOrder) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Backend> backend = MakeSingleRank();
  ASSERT_NE(backend, nullptr);
  DeviceVector<float> data(std::vector<float>(4096, 2.0f));
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 200; ++i) {
    works.push_back(
        backend->AllReduce(data.buffer(DataType::kFloat32), ReduceOp::kSum));
  }
  ASSERT_TRUE(works.back()->Wait(absl::Seconds(60)).ok());
  for (size_t i = 0; i < works.size(); ++i) {
    EXPECT_TRUE(works[i]->IsCompleted()) << "collective " << i;
    EXPECT_EQ(works[i]->sequence(), i + 1);
  }
}

// A buffer's stream (the caller's current stream) orders the collective
// after the work queued on it, and SynchronizeStream makes a stream wait for
// the collective: an all-gather queued behind a long memset on the caller's
// stream reads the memset's zeros, and a copy queued on that stream after
// SynchronizeStream reads the gathered zeros.
TEST(NcclBackendTest, OrdersAfterTheCallersStreamAndLetsAStreamWait) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Backend> backend = MakeSingleRank();
  ASSERT_NE(backend, nullptr);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* busy = nullptr;
  const size_t busy_bytes = size_t{512} << 20;
  ASSERT_EQ(cudaMalloc(&busy, busy_bytes), cudaSuccess);
  DeviceVector<float> in(std::vector<float>(1024, 3.0f));
  DeviceVector<float> out(std::vector<float>(1024, 5.0f));
  ASSERT_EQ(cudaMemsetAsync(busy, 1, busy_bytes, stream), cudaSuccess);
  Buffer input = in.buffer(DataType::kFloat32);
  ASSERT_EQ(cudaMemsetAsync(input.data, 0, input.bytes(), stream), cudaSuccess);
  input.stream = stream;
  std::shared_ptr<Work> work =
      backend->AllGather(input, out.buffer(DataType::kFloat32));
  ASSERT_TRUE(work->SynchronizeStream(stream, absl::Seconds(30)).ok());
  std::vector<float> host(1024, -1.0f);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), out.buffer(DataType::kFloat32).data,
                            host.size() * sizeof(float), cudaMemcpyDeviceToHost,
                            stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(host, std::vector<float>(1024, 0.0f));
  EXPECT_TRUE(work->Wait(absl::Seconds(30)).ok());
  cudaFree(busy);
  cudaStreamDestroy(stream);
}

TEST(NcclBackendTest, BadArgumentsAreInvalidArgument) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Backend> backend = MakeSingleRank();
  ASSERT_NE(backend, nullptr);
  std::vector<float> host(8, 1.0f);
  Buffer cpu{host.data(), host.size(), DataType::kFloat32, DeviceKind::kCpu, 0};
  EXPECT_EQ(backend->AllReduce(cpu, ReduceOp::kSum)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  DeviceVector<float> in(host), out(host);
  EXPECT_EQ(backend->Broadcast(in.buffer(DataType::kFloat32), 1)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  Buffer short_out = out.buffer(DataType::kFloat32);
  short_out.count = 3;
  EXPECT_EQ(backend->AllGather(in.buffer(DataType::kFloat32), short_out)
                ->Wait()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A buffer of another GPU (its index is all that is read).
  Buffer elsewhere = in.buffer(DataType::kFloat32);
  elsewhere.device_index = 1;
  const absl::Status refused =
      backend->AllReduce(elsewhere, ReduceOp::kSum)->Wait();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("buffer is on cuda:1"));
}

// An asynchronous error injected into the third collective (the seam's
// fault decorator, over the real communicator): that Work fails after the
// host moved on, and the next collective is ABORTED (re-form the round).
TEST(NcclBackendTest, AnInjectedAsyncErrorFailsItsWorkAndAbortsTheComm) {
  SKIP_WITHOUT_GPU();
  InMemoryStore store;
  BackendOptions options;
  options.timeout = absl::Seconds(30);
  NcclOptions nccl = OnGpu();
  nccl.faults = [](uint64_t n) {
    CommFault fault;
    if (n == 3) fault.kind = CommFault::Kind::kAsyncError;
    return fault;
  };
  auto backend = CreateNcclBackend(options, &store, nccl);
  ASSERT_TRUE(backend.ok()) << backend.status();
  DeviceVector<float> data(std::vector<float>(1024, 1.0f));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*backend)
                    ->AllReduce(data.buffer(DataType::kFloat32), ReduceOp::kSum)
                    ->Wait(absl::Seconds(30))
                    .ok());
  }
  auto third = (*backend)->AllReduce(data.buffer(DataType::kFloat32),
                                     ReduceOp::kSum);
  absl::Status failed = third->Wait(absl::Seconds(30));
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("injected asynchronous error"));
  EXPECT_EQ((*backend)
                ->AllReduce(data.buffer(DataType::kFloat32), ReduceOp::kSum)
                ->Wait(absl::Seconds(30))
                .code(),
            absl::StatusCode::kAborted);
}

// 20 cycles of a communicator that reduces, is aborted and is re-created:
// the GPU's memory in use ends where it was after the first cycle (within
// 64 MiB: NCCL and CUDA keep caches of their own). Prints the figures.
TEST(NcclBackendTest, AbortAndRecreateTwentyTimesKeepsGpuMemory) {
  SKIP_WITHOUT_GPU();
  DeviceVector<float> data(std::vector<float>(1 << 20, 1.0f));
  auto cycle = [&] {
    std::unique_ptr<Backend> backend = MakeSingleRank();
    ASSERT_NE(backend, nullptr);
    ASSERT_TRUE(backend->AllReduce(data.buffer(DataType::kFloat32), ReduceOp::kSum)
                    ->Wait(absl::Seconds(30))
                    .ok());
    backend->Abort();
    EXPECT_EQ(backend->Barrier()->Wait(absl::Seconds(30)).code(),
              absl::StatusCode::kAborted);
  };
  cycle();
  const int64_t before = Gpu()->MemoryInUse();
  const absl::Time start = absl::Now();
  for (int i = 0; i < 20; ++i) cycle();
  const int64_t after = Gpu()->MemoryInUse();
  std::printf("abort_recreate: 20 cycles in %.0f ms, GPU memory in use "
              "before %lld MiB, after %lld MiB\n",
              absl::ToDoubleMilliseconds(absl::Now() - start),
              static_cast<long long>(before >> 20),
              static_cast<long long>(after >> 20));
  EXPECT_LE(after - before, int64_t{64} << 20);
}

// PyTorch's allocator records events on the streams a tensor was used on
// when it frees the tensor, after the backend that made the stream may be
// gone: a stream handed back still takes work, and is the one handed out
// next (streams are kept for the process, not destroyed).
TEST(CudaNcclDeviceTest, AStreamHandedBackStillWorksAndIsReused) {
  SKIP_WITHOUT_GPU();
  NcclDevice* gpu = Gpu();
  absl::StatusOr<void*> stream = gpu->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  absl::StatusOr<void*> event = gpu->CreateEvent(/*timing=*/false);
  ASSERT_TRUE(event.ok()) << event.status();
  gpu->DestroyStream(*stream);
  EXPECT_TRUE(gpu->RecordEvent(*event, *stream).ok());
  EXPECT_TRUE(gpu->SynchronizeEvent(*event).ok());
  absl::StatusOr<void*> again = gpu->CreateStream();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *stream);
  gpu->DestroyStream(*again);
  gpu->DestroyEvent(*event);
}

TEST(NcclBackendTest, CreationFailsWithinTheTimeoutWhenARankNeverArrives) {
  SKIP_WITHOUT_GPU();
  InMemoryStore store;
  BackendOptions options;
  options.rank = 0;
  options.world_size = 2;  // rank 1 never comes
  options.timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  auto backend = CreateNcclBackend(options, &store, OnGpu());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kDeadlineExceeded)
      << backend.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

}  // namespace
}  // namespace gradsync
