// BroadcastTensors (and its stream-ordered form, BroadcastTensorsOrdered):
// rank `root`'s values reach every rank, whatever the mix
// of dtypes, shapes, strides and empty tensors, in one broadcast per dtype
// (per bucket), on Gloo and on the NCCL backend over simulated devices
// (whose collectives complete on their own threads), ranks as threads,
// world sizes 1 to 3.
#include "worker/ddp/tensor_broadcast.h"

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/backend/nccl_sim_group.h"
#include "worker/backend/gloo_backend.h"
#include "worker/backend/nccl_backend.h"
#include "worker/backend/nccl_device.h"
#include "worker/backend/observed_backend.h"
#include "worker/backend/store.h"
#include "worker/backend/work.h"

namespace gradsync {
namespace {

using ::gradsync::testing::kHealthyTimeout;

enum class Kind { kGloo, kNcclSim };

struct Param {
  Kind kind;
  int world_size;
};

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(info.param.kind == Kind::kGloo ? "gloo" : "nccl_sim") +
         "_world" + std::to_string(info.param.world_size);
}

// The backends of one world of the parameter's kind, and what they need.
class World {
 public:
  explicit World(const Param& param) {
    if (param.kind == Kind::kGloo) {
      gloo_ = testing::StartGroup<GlooBackend>(
          param.world_size, [&](int rank) {
            return GlooBackend::Create(
                testing::OptionsFor(rank, param.world_size, kHealthyTimeout),
                &store_);
          });
      backends_ = testing::Pointers(gloo_);
    } else {
      devices_ = testing::SimDevices(param.world_size);
      nccl_ = testing::StartNcclGroup(devices_, &store_);
      backends_ = testing::Pointers(nccl_);
    }
  }
  bool ok() const { return !backends_.empty(); }
  Backend* backend(int rank) const { return backends_[rank]; }

 private:
  InMemoryStore store_;
  std::vector<std::unique_ptr<NcclDevice>> devices_;
  std::vector<std::unique_ptr<GlooBackend>> gloo_;
  std::vector<std::unique_ptr<NcclBackend>> nccl_;
  std::vector<Backend*> backends_;
};

// Tensors like a model's buffers and parameters, with values that differ
// from rank to rank: float32 of several shapes (one a transposed view, one
// empty), int64 (a batch counter and a vector) and float64.
std::vector<torch::Tensor> TensorsOf(int rank) {
  const double base = 1000.0 * (rank + 1);
  auto f32 = torch::TensorOptions(torch::kFloat32);
  return {
      torch::arange(12, f32).reshape({3, 4}) + base,
      (torch::arange(20, f32).reshape({4, 5}) * 0.5 + base).t(),
      torch::full({}, rank + 7, torch::kInt64),
      torch::arange(7, torch::TensorOptions(torch::kFloat64)) / 3.0 + base,
      torch::empty({0, 3}, f32),
      torch::tensor({base, -base}, f32),
      torch::tensor({int64_t{1} << 40, int64_t{rank}, int64_t{-rank}},
                    torch::kInt64),
  };
}

class TensorBroadcastTest : public ::testing::TestWithParam<Param> {};

TEST_P(TensorBroadcastTest, EveryRankEndsWithTheRootsValuesInOneBroadcastPerDtype) {
  const int world = GetParam().world_size;
  const int root = world - 1;
  World group(GetParam());
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<torch::Tensor>> got(world);
  std::vector<std::vector<CollectiveRecord>> records(world);
  std::vector<absl::Status> status(world);
  testing::OnEveryRank(world, [&](int rank) {
    ObservedBackend observed(group.backend(rank));
    got[rank] = TensorsOf(rank);
    status[rank] = BroadcastTensors(&observed, got[rank], kHealthyTimeout, root);
    records[rank] = observed.TakeRecords();
  });
  const std::vector<torch::Tensor> want = TensorsOf(root);
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(rank);
    ASSERT_TRUE(status[rank].ok()) << status[rank];
    ASSERT_EQ(got[rank].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[rank][i], want[i])) << "tensor " << i;
      EXPECT_EQ(got[rank][i].strides(), want[i].strides()) << "tensor " << i;
    }
    // float32 (12 + 20 + 2 elements), int64 (1 + 3), float64 (7): in the
    // order each dtype first appears; the empty tensor costs nothing.
    ASSERT_EQ(records[rank].size(), 3u);
    EXPECT_EQ(records[rank][0].op, "broadcast");
    EXPECT_EQ(records[rank][0].dtype, DataType::kFloat32);
    EXPECT_EQ(records[rank][0].count, 34);
    EXPECT_EQ(records[rank][1].dtype, DataType::kInt64);
    EXPECT_EQ(records[rank][1].count, 4);
    EXPECT_EQ(records[rank][2].dtype, DataType::kFloat64);
    EXPECT_EQ(records[rank][2].count, 7);
  }
}

TEST_P(TensorBroadcastTest, ABucketHoldsAtMostItsBytesAndALoneTensorGoesInPlace) {
  const int world = GetParam().world_size;
  World group(GetParam());
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<torch::Tensor>> got(world);
  std::vector<std::vector<CollectiveRecord>> records(world);
  std::vector<const void*> data(world);
  std::vector<absl::Status> status(world);
  testing::OnEveryRank(world, [&](int rank) {
    ObservedBackend observed(group.backend(rank));
    // 16 + 16 bytes fit 32; then 8 would not; 40 is over on its own.
    got[rank] = {torch::full({4}, rank, torch::kFloat32),
                 torch::full({4}, rank + 10, torch::kFloat32),
                 torch::full({2}, rank + 20, torch::kFloat32),
                 torch::full({10}, rank + 30, torch::kFloat32)};
    data[rank] = got[rank][3].data_ptr();
    status[rank] = BroadcastTensors(&observed, got[rank], kHealthyTimeout,
                                    /*root=*/0, /*bucket_bytes=*/32);
    records[rank] = observed.TakeRecords();
  });
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(rank);
    ASSERT_TRUE(status[rank].ok()) << status[rank];
    const float want[] = {0, 10, 20, 30};
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(torch::equal(got[rank][i],
                               torch::full_like(got[rank][i], want[i])))
          << "tensor " << i;
    }
    EXPECT_EQ(got[rank][3].data_ptr(), data[rank]);
    ASSERT_EQ(records[rank].size(), 3u);
    EXPECT_EQ(records[rank][0].count, 8);
    EXPECT_EQ(records[rank][1].count, 2);
    EXPECT_EQ(records[rank][2].count, 10);
  }
}

// The ordered form hands back one Work per broadcast: on NCCL the host may
// not yet know whether they succeeded (a failed one: failed_step_test), on
// Gloo they have completed. Once they are waited for, the values are the
// root's, as with BroadcastTensors.
TEST_P(TensorBroadcastTest, OrderedReturnsEachBroadcastsWorkToCheck) {
  const int world = GetParam().world_size;
  World group(GetParam());
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<torch::Tensor>> got(world);
  std::vector<absl::Status> status(world);
  std::vector<size_t> works(world);
  testing::OnEveryRank(world, [&](int rank) {
    got[rank] = TensorsOf(rank);
    absl::StatusOr<std::vector<std::shared_ptr<Work>>> issued =
        BroadcastTensorsOrdered(group.backend(rank), got[rank],
                                kHealthyTimeout);
    status[rank] = issued.status();
    if (!issued.ok()) return;
    works[rank] = issued->size();
    for (const std::shared_ptr<Work>& work : *issued) {
      if (status[rank].ok()) status[rank] = work->Wait(kHealthyTimeout);
    }
  });
  const std::vector<torch::Tensor> want = TensorsOf(0);
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(rank);
    ASSERT_TRUE(status[rank].ok()) << status[rank];
    EXPECT_EQ(works[rank], 3u);  // float32, int64, float64
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[rank][i], want[i])) << "tensor " << i;
    }
  }
}

TEST_P(TensorBroadcastTest, ADtypeNoBackendCarriesIsRefusedByName) {
  const int world = GetParam().world_size;
  World group(GetParam());
  ASSERT_TRUE(group.ok());
  std::vector<absl::Status> status(world);
  testing::OnEveryRank(world, [&](int rank) {
    status[rank] = BroadcastTensors(
        group.backend(rank), {torch::zeros({2}, torch::kComplexFloat)},
        kHealthyTimeout);
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("ComplexFloat"), absl::string_view::npos) << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, TensorBroadcastTest,
    ::testing::Values(Param{Kind::kGloo, 1}, Param{Kind::kGloo, 2},
                      Param{Kind::kGloo, 3}, Param{Kind::kNcclSim, 1},
                      Param{Kind::kNcclSim, 2}, Param{Kind::kNcclSim, 3}),
    Name);

}  // namespace
}  // namespace gradsync
