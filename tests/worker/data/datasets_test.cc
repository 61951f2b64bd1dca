// The trainer's datasets: MNIST through LibTorch's IDX reader (files written
// here with known contents) and the synthetic set.
#include "worker/data/datasets.h"

#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::system(absl::StrCat("mkdir -p ", dir).c_str());
  return dir;
}

void PutBigEndian(std::ofstream& out, uint32_t value) {
  const char bytes[4] = {static_cast<char>(value >> 24),
                         static_cast<char>(value >> 16),
                         static_cast<char>(value >> 8),
                         static_cast<char>(value)};
  out.write(bytes, 4);
}

// LibTorch's reader insists on MNIST's real training-set size.
constexpr uint32_t kMnistTrainSize = 60000;

// Writes MNIST-format files with `count` images whose pixel i of image k is
// (k + i) % 256, labelled k % 10.
void WriteIdx(const std::string& dir, uint32_t count) {
  std::ofstream images(dir + "/train-images-idx3-ubyte", std::ios::binary);
  PutBigEndian(images, 2051);
  PutBigEndian(images, count);
  PutBigEndian(images, 28);
  PutBigEndian(images, 28);
  std::vector<char> pixels(size_t{count} * 28 * 28);
  for (uint32_t k = 0; k < count; ++k) {
    for (int i = 0; i < 28 * 28; ++i) {
      pixels[size_t{k} * 28 * 28 + i] = static_cast<char>((k + i) % 256);
    }
  }
  images.write(pixels.data(), pixels.size());
  std::ofstream labels(dir + "/train-labels-idx1-ubyte", std::ios::binary);
  PutBigEndian(labels, 2049);
  PutBigEndian(labels, count);
  std::vector<char> values(count);
  for (uint32_t k = 0; k < count; ++k) values[k] = static_cast<char>(k % 10);
  labels.write(values.data(), values.size());
}

TEST(LoadMnistTest, PixelsScaledToUnitRange) {
  const std::string dir = TempDir("mnist-ok");
  WriteIdx(dir, kMnistTrainSize);
  auto data = LoadMnist(dir);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size(), kMnistTrainSize);
  EXPECT_EQ(data->images.sizes(),
            (std::vector<int64_t>{kMnistTrainSize, 1, 28, 28}));
  EXPECT_EQ(data->images.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data->labels.scalar_type(), torch::kInt64);
  auto flat = data->images.reshape({kMnistTrainSize, 28 * 28});
  EXPECT_FLOAT_EQ(flat[0][0].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(flat[2][253].item<float>(), 255.0f / 255.0f);
  EXPECT_FLOAT_EQ(flat[1][9].item<float>(), 10.0f / 255.0f);
  EXPECT_EQ(data->labels[2].item<int64_t>(), 2);
  EXPECT_EQ(data->labels[59999].item<int64_t>(), 9);
}

TEST(LoadMnistTest, MissingFilesAreNotFound) {
  auto data = LoadMnist(TempDir("mnist-empty"));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr("train-images-idx3-ubyte is missing"));
}

TEST(LoadMnistTest, MalformedFilesAreDataLoss) {
  const std::string dir = TempDir("mnist-bad");
  WriteIdx(dir, 2);
  std::ofstream(dir + "/train-images-idx3-ubyte", std::ios::binary)
      << "not an idx file";
  auto data = LoadMnist(dir);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss)
      << data.status();
}

TEST(SyntheticDatasetTest, DeterministicPerSeedAndLearnable) {
  ImageDataset a = MakeSyntheticDataset(64, 5);
  ImageDataset b = MakeSyntheticDataset(64, 5);
  ImageDataset c = MakeSyntheticDataset(64, 6);
  EXPECT_TRUE(torch::equal(a.images, b.images));
  EXPECT_TRUE(torch::equal(a.labels, b.labels));
  EXPECT_FALSE(torch::equal(a.images, c.images));
  EXPECT_EQ(a.images.sizes(), (std::vector<int64_t>{64, 1, 28, 28}));
  EXPECT_GE(a.images.min().item<float>(), 0.0f);
  EXPECT_LE(a.images.max().item<float>(), 1.0f);
  EXPECT_GE(a.labels.min().item<int64_t>(), 0);
  EXPECT_LT(a.labels.max().item<int64_t>(), 10);
  // Several classes occur (the teacher is not degenerate).
  EXPECT_GE(std::get<0>(at::_unique(a.labels)).numel(), 3);
}

TEST(SyntheticDatasetTest, LeavesGlobalRandomStateAlone) {
  torch::manual_seed(3);
  torch::Tensor expected = torch::rand({4});
  torch::manual_seed(3);
  MakeSyntheticDataset(16, 1);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

}  // namespace
}  // namespace gradsync
