// BroadcastTrainingState: after it, every rank holds the root's parameters
// (bit for bit), buffers, optimizer state and counters; a transfer cut
// short leaves a receiver's own state whole. Ranks are threads
// joined by the Gloo backend over an in-memory store, parameterized over
// world size and root.
#include "worker/ddp/training_state.h"

#include <torch/torch.h>

#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/ddp/gloo_ranks.h"
#include "worker/ddp/tensor_broadcast.h"
#include "worker/runtime/elastic.h"

namespace gradsync {
namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(6, 5))),
        norm(register_module("norm", torch::nn::BatchNorm1d(5))),
        fc2(register_module("fc2", torch::nn::Linear(5, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::relu(norm(fc1(x))));
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

// Trains `net` for `steps` steps on data seeded by `seed`.
void Train(Net& net, torch::optim::SGD& optimizer, int steps, int seed) {
  torch::Generator generator = at::detail::createCPUGenerator(seed);
  for (int s = 0; s < steps; ++s) {
    torch::Tensor x = torch::randn({8, 6}, generator);
    torch::Tensor y = torch::randint(0, 3, {8}, generator, torch::kInt64);
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    optimizer.step();
  }
}

std::vector<torch::Tensor> State(Net& net) {
  std::vector<torch::Tensor> state;
  for (const auto& p : net->parameters()) state.push_back(p.detach().clone());
  for (const auto& b : net->buffers()) state.push_back(b.clone());
  return state;
}

class TrainingStateTest
    : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TrainingStateTest, EveryRankEndsWithTheRootsState) {
  const auto [world_size, last_is_root] = GetParam();
  const int root = last_is_root ? world_size - 1 : 0;
  std::vector<std::vector<torch::Tensor>> after_sync(world_size);
  std::vector<std::vector<torch::Tensor>> after_step(world_size);
  std::vector<std::vector<int64_t>> counters(world_size);
  RunGlooRanks(world_size, [&](int rank, Backend* backend) {
    Net net;
    {
      torch::NoGradGuard no_grad;  // a different start on every rank
      for (auto& p : net->parameters()) p.uniform_(-rank - 1.0, rank + 1.0);
    }
    torch::optim::SGD optimizer(net->parameters(),
                                torch::optim::SGDOptions(0.1).momentum(0.9));
    // The root has trained (momentum state); the others have not, or less.
    Train(net, optimizer, rank == root ? 3 : rank % 2, 100 + rank);
    counters[rank] = {rank * 10, rank, rank + 7};
    absl::Status synced = BroadcastTrainingState(
        backend, root, *net, optimizer, &counters[rank], absl::Seconds(60));
    ASSERT_TRUE(synced.ok()) << synced;
    after_sync[rank] = State(net);
    // The same step everywhere: equal results need equal momentum too.
    Train(net, optimizer, 1, 999);
    after_step[rank] = State(net);
  });
  for (int rank = 0; rank < world_size; ++rank) {
    EXPECT_EQ(counters[rank], (std::vector<int64_t>{root * 10, root, root + 7}));
    ASSERT_EQ(after_sync[rank].size(), after_sync[root].size());
    for (size_t i = 0; i < after_sync[root].size(); ++i) {
      EXPECT_TRUE(torch::equal(after_sync[rank][i], after_sync[root][i]))
          << "tensor " << i << " of rank " << rank;
      EXPECT_TRUE(torch::equal(after_step[rank][i], after_step[root][i]))
          << "tensor " << i << " of rank " << rank << " after one more step";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizesAndRoots, TrainingStateTest,
    ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
      return absl::StrCat("W", std::get<0>(info.param),
                          std::get<1>(info.param) ? "_LastRankIsRoot"
                                                  : "_RankZeroIsRoot");
    });

TEST(TrainingStateErrorsTest, APeerLostDuringTheTransferIsARecoverableError) {
  // Rank 2 dies as the transfer starts (its process group aborts, as a
  // killed process's connections close). The others must not hang, and
  // must fail with an error that re-forming the round fixes: in the
  // transfer, or at the latest in the next collective (what the root sends
  // may fit in socket buffers before the connection closes).
  constexpr int kWorld = 3;
  constexpr absl::Duration kTimeout = absl::Seconds(10);
  std::vector<absl::Status> statuses(kWorld);
  const absl::Time start = absl::Now();
  absl::Mutex mu;
  int created = 0;  // ranks whose process group is whole
  RunGlooRanks(kWorld, [&](int rank, Backend* backend) {
    {
      // Rank 2 aborts only once every rank finished connecting: an abort
      // during another rank's bootstrap would fail that rank's Create.
      absl::MutexLock lock(&mu);
      ++created;
      const auto all = [&] { return created == kWorld; };
      mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60));
    }
    if (rank == 2) {
      backend->Abort();
      return;
    }
    Net net;
    torch::optim::SGD optimizer(net->parameters(),
                                torch::optim::SGDOptions(0.1).momentum(0.9));
    Train(net, optimizer, 2, 7);
    std::vector<int64_t> counters = {5, 1};
    statuses[rank] = BroadcastTrainingState(backend, /*root=*/0, *net,
                                            optimizer, &counters, kTimeout);
    if (statuses[rank].ok()) statuses[rank] = backend->Barrier()->Wait(kTimeout);
  });
  EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(20)) << "no hang";
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(RecoverableByRejoining(statuses[rank]))
        << "rank " << rank << ": " << statuses[rank];
  }
}

TEST(TrainingStateErrorsTest, ATransferCutShortLeavesTheReceiversOwnState) {
  // The root (rank 0) sends its counters and its parameters and buffers,
  // then dies before its optimizer state (its process group aborts): the
  // receiver fails, and keeps every tensor, its momentum and its counters
  // as they were (a mix of root's and its own would look like a committed
  // step, and the next round might copy it to every rank).
  constexpr absl::Duration kTimeout = absl::Seconds(10);
  std::vector<torch::Tensor> before, after;
  std::string momentum_before, momentum_after;
  std::vector<int64_t> counters = {5, 1};
  absl::Status received;
  RunGlooRanks(2, [&](int rank, Backend* backend) {
    Net net;
    torch::optim::SGD optimizer(net->parameters(),
                                torch::optim::SGDOptions(0.1).momentum(0.9));
    Train(net, optimizer, rank == 0 ? 3 : 1, 10 + rank);
    if (rank == 0) {  // BroadcastTrainingState's first two collectives
      torch::Tensor root_counters = torch::tensor({9, 2}, torch::kInt64);
      ASSERT_TRUE(BroadcastTensors(backend, {root_counters}, kTimeout).ok());
      std::vector<torch::Tensor> tensors = net->parameters();
      for (const auto& b : net->buffers()) tensors.push_back(b);
      ASSERT_TRUE(BroadcastTensors(backend, tensors, kTimeout).ok());
      backend->Abort();
      return;
    }
    const auto momentum = [&] {  // SGD's state, as torch::save writes it
      std::ostringstream out;
      torch::save(optimizer, out);
      return out.str();
    };
    before = State(net);
    momentum_before = momentum();
    received = BroadcastTrainingState(backend, /*root=*/0, *net, optimizer,
                                      &counters, kTimeout);
    after = State(net);
    momentum_after = momentum();
  });
  EXPECT_TRUE(RecoverableByRejoining(received)) << received;
  EXPECT_EQ(counters, (std::vector<int64_t>{5, 1}));
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(after[i], before[i])) << "tensor " << i;
  }
  EXPECT_FALSE(momentum_before.empty());
  EXPECT_TRUE(momentum_after == momentum_before) << "the momentum changed";
}

TEST(TrainingStateErrorsTest, RootOutsideTheWorldIsInvalidArgument) {
  RunGlooRanks(1, [](int, Backend* backend) {
    Net net;
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
    std::vector<int64_t> counters = {1};
    absl::Status status = BroadcastTrainingState(backend, 3, *net, optimizer,
                                                 &counters, absl::Seconds(5));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace gradsync
