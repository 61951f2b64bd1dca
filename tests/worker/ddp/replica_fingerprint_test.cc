// FingerprintReplica: equal replicas have equal digests, parameters and
// optimizer state (SGD's momentum, Adam's moments) are covered by name, and
// one flipped bit changes exactly the digest of its tensor.
#include "worker/ddp/replica_fingerprint.h"

#include <torch/torch.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;

torch::nn::Sequential Net(torch::ScalarType dtype) {
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(4, 3), torch::nn::ReLU(),
                            torch::nn::Linear(3, 2));
  net->to(dtype);
  return net;
}

void Step(torch::nn::Sequential& net, torch::optim::Optimizer& optimizer,
          torch::ScalarType dtype) {
  optimizer.zero_grad();
  net->forward(torch::ones({5, 4}, dtype)).sum().backward();
  optimizer.step();
}

class ReplicaFingerprintTest
    : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(ReplicaFingerprintTest, EqualReplicasAgreeAndOneFlippedBitDoesNot) {
  const torch::ScalarType dtype = GetParam();
  torch::nn::Sequential a = Net(dtype), b = Net(dtype);
  torch::optim::SGD sgd_a(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD sgd_b(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Step(a, sgd_a, dtype);
  Step(b, sgd_b, dtype);
  absl::StatusOr<ReplicaDigest> da = FingerprintReplica(*a, sgd_a);
  absl::StatusOr<ReplicaDigest> db = FingerprintReplica(*b, sgd_b);
  ASSERT_TRUE(da.ok() && db.ok()) << da.status() << db.status();
  EXPECT_THAT(da->names,
              ElementsAre("0.weight", "0.bias", "2.weight", "2.bias",
                          "0.weight:momentum_buffer", "0.bias:momentum_buffer",
                          "2.weight:momentum_buffer", "2.bias:momentum_buffer"));
  ASSERT_EQ(da->values.size(), da->names.size());
  EXPECT_EQ(da->values, db->values);

  if (dtype != torch::kFloat32) return;  // the flip is of a float32 bit
  ASSERT_TRUE(FlipOneParameterBit(*b).ok());
  absl::StatusOr<ReplicaDigest> flipped = FingerprintReplica(*b, sgd_b);
  ASSERT_TRUE(flipped.ok()) << flipped.status();
  for (size_t i = 0; i < da->values.size(); ++i) {
    EXPECT_EQ(flipped->values[i] != da->values[i], i == 0) << da->names[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReplicaFingerprintTest,
                         ::testing::Values(torch::kFloat32, torch::kFloat64));

TEST(ReplicaFingerprintAdamTest, AdamsMomentsAreCovered) {
  torch::nn::Sequential net = Net(torch::kFloat32);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
  Step(net, adam, torch::kFloat32);
  absl::StatusOr<ReplicaDigest> digest = FingerprintReplica(*net, adam);
  ASSERT_TRUE(digest.ok()) << digest.status();
  ASSERT_EQ(digest->names.size(), 4u + 4u * 2u);
  EXPECT_EQ(digest->names[4], "0.weight:exp_avg");
  EXPECT_EQ(digest->names[5], "0.weight:exp_avg_sq");
}

}  // namespace
}  // namespace gradsync
