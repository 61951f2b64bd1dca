// DigestTensors: the checksum of each tensor's bit patterns in its own
// width (wrapping), one value per name; bad arguments are refused.
#include "worker/ddp/tensor_digest.h"

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TensorDigestTest, EachTensorsBitPatternsSumInTheirOwnWidth) {
  // int32 bits of 1.0f: 0x3f800000; wrapping in 32 bits, three of them sum
  // to 0x3f800000 * 3 mod 2^32 = 0xbe800000, as a signed int32 widened.
  const torch::Tensor ones = torch::ones({3}, torch::kFloat32);
  const torch::Tensor bytes = torch::tensor({200, 100}, torch::kUInt8);
  const torch::Tensor halves = torch::ones({2}, torch::kFloat16);  // 0x3c00
  const torch::Tensor empty = torch::empty({0}, torch::kFloat64);
  absl::StatusOr<ReplicaDigest> digest = DigestTensors(
      {"ones", "bytes", "halves", "empty"}, {ones, bytes, halves, empty});
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_THAT(digest->names, ElementsAre("ones", "bytes", "halves", "empty"));
  const auto as_int32 = [](uint32_t bits) {
    return static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(bits)));
  };
  EXPECT_THAT(digest->values,
              ElementsAre(as_int32(0x3f800000u * 3u),
                          uint64_t{(200 + 100) % 256},
                          uint64_t{0x3c00 * 2},
                          uint64_t{0}));
}

TEST(TensorDigestTest, OneFlippedBitChangesOnlyItsTensorsValue) {
  torch::manual_seed(7);
  const std::vector<torch::Tensor> tensors = {torch::randn({64}),
                                              torch::randn({8, 8})};
  std::vector<torch::Tensor> copies = {tensors[0].clone(), tensors[1].clone()};
  copies[1].view(torch::kInt32).view({-1})[5].bitwise_xor_(1);  // lowest bit
  absl::StatusOr<ReplicaDigest> a = DigestTensors({"a", "b"}, tensors);
  absl::StatusOr<ReplicaDigest> b = DigestTensors({"a", "b"}, copies);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(a->values[0], b->values[0]);
  EXPECT_NE(a->values[1], b->values[1]);
}

TEST(TensorDigestTest, NamesThatDoNotMatchTheTensorsAreRefused) {
  absl::StatusOr<ReplicaDigest> short_names =
      DigestTensors({"a"}, {torch::ones({1}), torch::ones({1})});
  EXPECT_TRUE(absl::IsInvalidArgument(short_names.status()));
  EXPECT_THAT(short_names.status().message(),
              HasSubstr("1 names for 2 tensors"));
  absl::StatusOr<ReplicaDigest> undefined =
      DigestTensors({"a", "w"}, {torch::ones({1}), torch::Tensor()});
  EXPECT_TRUE(absl::IsInvalidArgument(undefined.status()));
  EXPECT_THAT(undefined.status().message(), HasSubstr("'w'"));
}

TEST(TensorDigestTest, NoTensorsIsAnEmptyDigest) {
  absl::StatusOr<ReplicaDigest> digest = DigestTensors({}, {});
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_TRUE(digest->names.empty());
  EXPECT_TRUE(digest->values.empty());
}

}  // namespace
}  // namespace gradsync
