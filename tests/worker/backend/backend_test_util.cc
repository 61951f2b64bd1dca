#include "tests/worker/backend/backend_test_util.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace gradsync {
namespace testing {

using ::testing::HasSubstr;

void ExpectBroadcastFromEveryRoot(const std::vector<Backend*>& backends,
                                  size_t count) {
  const int n = static_cast<int>(backends.size());
  auto value = [](int r, size_t i) { return r * 1000 + i + 0.25; };
  // buffers[root][r]: rank r's buffer in the broadcast from `root`.
  std::vector<std::vector<std::vector<double>>> buffers(
      n, std::vector<std::vector<double>>(n));
  std::vector<std::shared_ptr<Work>> works;
  for (int root = 0; root < n; ++root) {
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        buffers[root][r].push_back(value(r, i));
      }
    }
  }
  for (int root = 0; root < n; ++root) {
    for (int r = 0; r < n; ++r) {
      works.push_back(backends[r]->Broadcast(BufferOf(buffers[root][r]), root));
    }
  }
  ExpectAllOk(works);
  for (int root = 0; root < n; ++root) {
    for (int r = 0; r < n; ++r) {
      ExpectElements(
          buffers[root][r], [&](size_t i) { return value(root, i); },
          absl::StrCat("root ", root, ", rank ", r));
    }
  }
}

void ExpectAllGatherInRankOrder(const std::vector<Backend*>& backends,
                                size_t count) {
  const int n = static_cast<int>(backends.size());
  std::vector<std::vector<int32_t>> inputs(n);
  std::vector<std::vector<int32_t>> outputs(
      n, std::vector<int32_t>(n * count, -1));
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      inputs[r].push_back(static_cast<int32_t>(r * 1000000 + i));
    }
    works.push_back(
        backends[r]->AllGather(BufferOf(inputs[r]), BufferOf(outputs[r])));
  }
  ExpectAllOk(works);
  for (int r = 0; r < n; ++r) {
    ExpectElements(
        outputs[r],
        [count](size_t j) {
          return static_cast<int32_t>((j / count) * 1000000 + j % count);
        },
        absl::StrCat("rank ", r));
  }
}

void ExpectBarrierWaitsForEveryRank(const std::vector<Backend*>& backends) {
  const int n = static_cast<int>(backends.size());
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r + 1 < n; ++r) works.push_back(backends[r]->Barrier());
  for (const auto& work : works) {
    EXPECT_EQ(work->Wait(kBriefly).code(), absl::StatusCode::kDeadlineExceeded)
        << "a barrier completed before the last rank entered it";
  }
  works.push_back(backends[n - 1]->Barrier());
  ExpectAllOk(works);
}

void ExpectAbortEndsTheCollectiveInFlight(
    const std::vector<Backend*>& backends) {
  if (backends.size() < 2) return;  // a barrier of one never waits
  std::shared_ptr<Work> blocked = backends[0]->Barrier();
  ASSERT_EQ(blocked->Wait(kBriefly).code(), absl::StatusCode::kDeadlineExceeded)
      << "the barrier completed without the other ranks";
  backends[0]->Abort();
  const absl::Status ended = blocked->Wait(kBound);
  EXPECT_FALSE(ended.ok());
  EXPECT_NE(ended.code(), absl::StatusCode::kDeadlineExceeded)
      << "the abort did not end the barrier: " << ended;
  backends[0]->Abort();  // idempotent
  EXPECT_FALSE(backends[0]->Barrier()->Wait(kBound).ok());
  if (backends.size() == 2) {
    const absl::Status peer = backends[1]->Barrier()->Wait(kBound);
    EXPECT_FALSE(peer.ok());
    EXPECT_NE(peer.code(), absl::StatusCode::kDeadlineExceeded) << peer;
  }
}

void ExpectAwaitEndsACollectiveThatTimedOut(
    const std::vector<Backend*>& backends) {
  if (backends.size() < 2) return;  // an all-reduce of one never waits
  std::vector<int64_t> values(64, 1);
  std::shared_ptr<Work> work =
      backends[0]->AllReduce(BufferOf(values), ReduceOp::kSum);
  const absl::Status status = backends[0]->Await(*work, kBriefly);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(work->IsCompleted())
      << "Await returned with the all-reduce still running";
  EXPECT_FALSE(work->status().ok());
}

void ExpectManyCollectivesCompleteInOrder(const std::vector<Backend*>& backends,
                                          int collectives, size_t max_size) {
  const int n = static_cast<int>(backends.size());
  // What collective j is, the same on every rank: 0 allreduce sum (int64),
  // 1 allreduce average (float32), 2 broadcast (int64), 3 allgather (int64),
  // 4 barrier. Sizes vary and include 0.
  auto kind = [](int j) { return j % 5; };
  auto size = [max_size](int j) {
    return static_cast<size_t>(j * 37) % (max_size + 1);
  };
  auto value = [](int r, int j, size_t i) {
    return static_cast<int64_t>(r * 100000 + j * 1000 + i);
  };

  std::vector<std::vector<std::vector<int64_t>>> ints(n);
  std::vector<std::vector<std::vector<float>>> floats(n);
  std::vector<std::vector<std::vector<int64_t>>> gathered(n);
  std::vector<std::vector<std::shared_ptr<Work>>> works(n);
  OnEveryRank(n, [&](int r) {
    ints[r].resize(collectives);
    floats[r].resize(collectives);
    gathered[r].resize(collectives);
    for (int j = 0; j < collectives; ++j) {
      for (size_t i = 0; i < size(j); ++i) {
        ints[r][j].push_back(value(r, j, i));
        floats[r][j].push_back(static_cast<float>(value(r, j, i)));
      }
      gathered[r][j].assign(n * size(j), -1);
    }
    Backend& backend = *backends[r];
    for (int j = 0; j < collectives; ++j) {
      switch (kind(j)) {
        case 0:
          works[r].push_back(
              backend.AllReduce(BufferOf(ints[r][j]), ReduceOp::kSum));
          break;
        case 1:
          works[r].push_back(
              backend.AllReduce(BufferOf(floats[r][j]), ReduceOp::kAverage));
          break;
        case 2:
          works[r].push_back(backend.Broadcast(BufferOf(ints[r][j]), j % n));
          break;
        case 3:
          works[r].push_back(backend.AllGather(BufferOf(ints[r][j]),
                                               BufferOf(gathered[r][j])));
          break;
        case 4:
          works[r].push_back(backend.Barrier());
          break;
      }
    }
    for (int j = 0; j < collectives; ++j) {
      EXPECT_EQ(works[r][j]->sequence(), static_cast<uint64_t>(j + 1));
      absl::Status status = works[r][j]->Wait(kBound);
      EXPECT_TRUE(status.ok())
          << "rank " << r << ", #" << j + 1 << ": " << status;
      // Completed in order: everything issued before it has completed too.
      for (int k = 0; k < j; ++k) EXPECT_TRUE(works[r][k]->IsCompleted());
    }
  });

  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < collectives; ++j) {
      const std::string what =
          absl::StrCat("rank ", r, ", collective #", j + 1);
      switch (kind(j)) {
        case 0:
          ExpectElements(
              ints[r][j],
              [&](size_t i) {
                return n * value(0, j, i) + 100000 * RankSum(n);
              },
              what);
          break;
        case 1:
          ExpectElements(
              floats[r][j],
              [&](size_t i) {
                return static_cast<double>(value(0, j, i) + 50000 * (n - 1));
              },
              what);
          break;
        case 2:
          ExpectElements(
              ints[r][j], [&](size_t i) { return value(j % n, j, i); }, what);
          break;
        case 3:
          ExpectElements(
              gathered[r][j],
              [&](size_t k) {
                return value(static_cast<int>(k / size(j)), j, k % size(j));
              },
              what);
          break;
      }
    }
  }
}

void ExpectEmptyCollectiveWaitsForEarlierOnes(
    const std::vector<Backend*>& backends) {
  const int n = static_cast<int>(backends.size());
  std::vector<std::vector<float>> data(n, std::vector<float>(5, 1.0f));
  std::vector<float> empty;
  std::vector<std::shared_ptr<Work>> first;
  std::vector<std::shared_ptr<Work>> second;
  for (int r = 0; r + 1 < n; ++r) {
    first.push_back(backends[r]->AllReduce(BufferOf(data[r]), ReduceOp::kSum));
    second.push_back(backends[r]->AllReduce(BufferOf(empty), ReduceOp::kSum));
  }
  for (const auto& work : second) {
    EXPECT_EQ(work->Wait(kBriefly).code(), absl::StatusCode::kDeadlineExceeded)
        << "the empty allreduce overtook the one before it";
  }
  first.push_back(
      backends[n - 1]->AllReduce(BufferOf(data[n - 1]), ReduceOp::kSum));
  second.push_back(backends[n - 1]->AllReduce(BufferOf(empty), ReduceOp::kSum));
  ExpectAllOk(first);
  ExpectAllOk(second);
  for (int r = 0; r < n; ++r) {
    ExpectElements(
        data[r], [n](size_t) { return static_cast<float>(n); },
        absl::StrCat("rank ", r));
  }
}

pid_t ForkRank(const std::function<int()>& body) {
  std::fflush(nullptr);  // or the child would print the parent's buffers
  const pid_t pid = fork();
  if (pid == 0) {
    const int code = body();
    std::fflush(nullptr);
    _exit(code);
  }
  return pid;
}

int CheckCollectivesOfAProcessRank(Backend& b, size_t count) {
  const int rank = b.rank();
  const int n = b.world_size();
  auto ok = [&](const std::shared_ptr<Work>& work) {
    absl::Status status = work->Wait(kBound);
    if (!status.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
    }
    return status.ok();
  };
  // 1: allreduce sum of float32.
  std::vector<float> floats(count);
  for (size_t i = 0; i < count; ++i) floats[i] = rank * 1000.0f + i;
  if (!ok(b.AllReduce(BufferOf(floats), ReduceOp::kSum))) return 1;
  for (size_t i = 0; i < count; ++i) {
    if (floats[i] != n * static_cast<float>(i) + 1000.0f * RankSum(n)) return 1;
  }
  // 2: allreduce average of int64.
  std::vector<int64_t> ints(count);
  for (size_t i = 0; i < count; ++i) ints[i] = rank * kBig + i;
  if (!ok(b.AllReduce(BufferOf(ints), ReduceOp::kAverage))) return 2;
  for (size_t i = 0; i < count; ++i) {
    if (ints[i] != static_cast<int64_t>(i) + kBig * RankSum(n) / n) return 2;
  }
  // 3: broadcast from the last rank.
  std::vector<double> doubles(count, rank);
  if (!ok(b.Broadcast(BufferOf(doubles), n - 1))) return 3;
  for (double d : doubles) {
    if (d != n - 1) return 3;
  }
  // 4: allgather.
  std::vector<int32_t> mine((count + 9) / 10, rank);
  std::vector<int32_t> all(n * mine.size(), -1);
  if (!ok(b.AllGather(BufferOf(mine), BufferOf(all)))) return 4;
  for (size_t k = 0; k < all.size(); ++k) {
    if (all[k] != static_cast<int32_t>(k / mine.size())) return 4;
  }
  // 5: barrier.
  if (!ok(b.Barrier())) return 5;
  return 0;
}

void ExpectBadArgumentsFailAtOnce(const std::vector<Backend*>& backends) {
  ASSERT_EQ(backends.size(), 2u);
  Backend& backend = *backends[0];
  const std::string name = backend.name();
  std::vector<float> data(4, 1.0f);
  std::vector<float> small_output(7);

  Buffer cuda = BufferOf(data);
  cuda.device = DeviceKind::kCuda;
  Buffer null_data{nullptr, 3, DataType::kFloat32};

  struct Case {
    const char* what;
    std::shared_ptr<Work> work;
    std::string message;
  };
  const Case cases[] = {
      {"cuda allreduce", backend.AllReduce(cuda, ReduceOp::kSum),
       name + " allreduce: buffer is on cuda, expected cpu"},
      {"cuda broadcast", backend.Broadcast(cuda, 0),
       name + " broadcast: buffer is on cuda, expected cpu"},
      {"cuda allgather output", backend.AllGather(BufferOf(data), cuda),
       name + " allgather output: buffer is on cuda"},
      {"null data", backend.AllReduce(null_data, ReduceOp::kSum),
       "buffer of 3 elements has no data pointer"},
      {"null allgather input", backend.AllGather(null_data, BufferOf(data)),
       "no data pointer"},
      {"allgather output too small",
       backend.AllGather(BufferOf(data), BufferOf(small_output)),
       "output holds 7 elements; needs 4 x 2 ranks"},
      {"allgather dtype mismatch",
       backend.AllGather(BufferOf(data),
                         Buffer{small_output.data(), 8, DataType::kInt32}),
       "input is float32, output is int32"},
      {"negative root", backend.Broadcast(BufferOf(data), -1),
       "broadcast root -1 is not a rank in [0, 2)"},
      {"root past the last rank", backend.Broadcast(BufferOf(data), 2),
       "broadcast root 2 is not a rank in [0, 2)"},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(c.work->IsCompleted()) << c.what;
    EXPECT_EQ(c.work->status().code(), absl::StatusCode::kInvalidArgument)
        << c.what << ": " << c.work->status();
    EXPECT_THAT(std::string(c.work->status().message()), HasSubstr(c.message))
        << c.what;
  }

  // The rejected calls consumed no sequence number: rank 0's next
  // collective still matches rank 1's first.
  std::vector<float> other(4, 2.0f);
  auto work0 = backends[0]->AllReduce(BufferOf(data), ReduceOp::kSum);
  auto work1 = backends[1]->AllReduce(BufferOf(other), ReduceOp::kSum);
  ExpectAllOk({work0, work1});
  EXPECT_EQ(work0->sequence(), 1u);
  EXPECT_EQ(work1->sequence(), 1u);
  ExpectElements(
      data, [](size_t) { return 3.0f; }, "rank 0");
}

}  // namespace testing
}  // namespace gradsync
