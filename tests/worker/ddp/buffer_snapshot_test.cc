// BufferSnapshot: the buffers a training forward moves (BatchNorm's running
// statistics in float32, its batch counter in int64) go back to what they
// were when the snapshot was taken, in place; a cleared snapshot puts
// nothing back; a module without buffers costs nothing.
#include "worker/ddp/buffer_snapshot.h"

#include <torch/torch.h>

#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/ddp/tensor_lists.h"

namespace gradsync {
namespace {

using ::gradsync::testing::Equal;

torch::nn::Sequential Model() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Linear(4, 3), nn::BatchNorm1d(3), nn::ReLU(),
                        nn::Linear(3, 2), nn::BatchNorm1d(2));
}

// Clones of `module`'s buffers.
std::vector<torch::Tensor> Copies(const torch::nn::Module& module) {
  return testing::Copy(module.buffers());
}

// A training forward: moves every BatchNorm buffer.
void Forward(torch::nn::Sequential& model, int seed) {
  torch::manual_seed(seed);
  model->forward(torch::randn({8, 4}));
}

TEST(BufferSnapshotTest, RestorePutsBackWhatAForwardMovedInPlace) {
  torch::nn::Sequential model = Model();
  Forward(model, 1);
  const std::vector<torch::Tensor> before = Copies(*model);
  std::vector<const void*> storage;
  for (const torch::Tensor& b : model->buffers()) storage.push_back(b.data_ptr());

  BufferSnapshot snapshot;
  snapshot.Take(*model);
  EXPECT_TRUE(snapshot.held());
  Forward(model, 2);
  Forward(model, 3);
  ASSERT_FALSE(Equal(Copies(*model), before)) << "the forwards moved nothing";
  snapshot.Restore();

  EXPECT_FALSE(snapshot.held());
  EXPECT_TRUE(Equal(Copies(*model), before));
  const std::vector<torch::Tensor> after = model->buffers();
  ASSERT_EQ(after.size(), storage.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].data_ptr(), storage[i]) << "buffer " << i << " moved";
  }
}

TEST(BufferSnapshotTest, AClearedSnapshotPutsNothingBack) {
  torch::nn::Sequential model = Model();
  BufferSnapshot snapshot;
  snapshot.Take(*model);
  Forward(model, 4);
  const std::vector<torch::Tensor> committed = Copies(*model);
  snapshot.Clear();
  snapshot.Restore();
  EXPECT_TRUE(Equal(Copies(*model), committed));
}

TEST(BufferSnapshotTest, ATakeReplacesTheLastOne) {
  torch::nn::Sequential model = Model();
  BufferSnapshot snapshot;
  snapshot.Take(*model);
  Forward(model, 5);
  const std::vector<torch::Tensor> second = Copies(*model);
  snapshot.Take(*model);
  Forward(model, 6);
  snapshot.Restore();
  EXPECT_TRUE(Equal(Copies(*model), second));
}

TEST(BufferSnapshotTest, AModuleWithoutBuffersHoldsNothing) {
  torch::nn::Linear model(4, 2);
  BufferSnapshot snapshot;
  snapshot.Take(*model);
  EXPECT_FALSE(snapshot.held());
  snapshot.Restore();  // harmless
}

}  // namespace
}  // namespace gradsync
