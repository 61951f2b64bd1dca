// The trainer's datasets: MNIST through LibTorch's IDX reader and CIFAR-10's
// binary batches (files written here with known contents), and the synthetic
// set.
#include "worker/data/datasets.h"

#include <torch/torch.h>
#include <unistd.h>

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

// CIFAR-10 test records: record k's label is k % 10 and its pixel (c, y, x)
// is CifarPixel(k, c, y, x).
uint8_t CifarPixel(int k, int c, int y, int x) {
  return static_cast<uint8_t>((k * 11 + c * 80 + y * 5 + x) % 256);
}

// Writes records first .. first + count - 1 to `path`, with `labels`
// instead of k % 10 where given.
void WriteCifarBatch(const std::string& path, int first, int count,
                     const std::vector<int>& labels = {}) {
  std::string bytes;
  for (int k = first; k < first + count; ++k) {
    const int i = k - first;
    bytes.push_back(static_cast<char>(i < static_cast<int>(labels.size())
                                          ? labels[i]
                                          : k % 10));
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 32; ++y) {
        for (int x = 0; x < 32; ++x) {
          bytes.push_back(static_cast<char>(CifarPixel(k, c, y, x)));
        }
      }
    }
  }
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(LoadCifar10Test, ReadsAPrefixOfBatchesChannelMajorScaled) {
  const std::string dir = TempDir("cifar-ok");
  WriteCifarBatch(dir + "/data_batch_1.bin", 0, 3);
  WriteCifarBatch(dir + "/data_batch_2.bin", 3, 2);
  auto data = LoadCifar10(dir);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->images.sizes(), (std::vector<int64_t>{5, 3, 32, 32}));
  EXPECT_EQ(data->images.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(data->labels,
                           torch::tensor({0, 1, 2, 3, 4}, torch::kInt64)));
  // The same (y, x) in the three channels, in both files; 255 scales to 1.
  for (int k : {0, 4}) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_FLOAT_EQ(data->images[k][c][7][20].item<float>(),
                      CifarPixel(k, c, 7, 20) / 255.0f)
          << "record " << k << " channel " << c;
    }
  }
  ASSERT_EQ(int{CifarPixel(1, 2, 16, 4)}, 255);
  EXPECT_FLOAT_EQ(data->images[1][2][16][4].item<float>(), 1.0f);
  ASSERT_EQ(int{CifarPixel(0, 0, 0, 0)}, 0);
  EXPECT_FLOAT_EQ(data->images[0][0][0][0].item<float>(), 0.0f);
}

TEST(LoadCifar10Test, MissingFirstBatchIsNotFound) {
  auto data = LoadCifar10(TempDir("cifar-empty"));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr("data_batch_1.bin is missing"));
}

TEST(LoadCifar10Test, BatchMissingBeforeALaterOneIsNotFound) {
  const std::string dir = TempDir("cifar-hole");
  WriteCifarBatch(dir + "/data_batch_1.bin", 0, 1);
  WriteCifarBatch(dir + "/data_batch_3.bin", 1, 1);
  auto data = LoadCifar10(dir);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr("data_batch_2.bin is missing but"));
}

TEST(LoadCifar10Test, PartialRecordIsDataLoss) {
  const std::string dir = TempDir("cifar-truncated");
  WriteCifarBatch(dir + "/data_batch_1.bin", 0, 2);
  ASSERT_EQ(truncate((dir + "/data_batch_1.bin").c_str(), 2 * 3073 - 1), 0);
  auto data = LoadCifar10(dir);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr("data_batch_1.bin holds 6145 bytes"));
}

TEST(LoadCifar10Test, LabelAboveNineIsDataLoss) {
  const std::string dir = TempDir("cifar-label");
  WriteCifarBatch(dir + "/data_batch_1.bin", 0, 1);
  WriteCifarBatch(dir + "/data_batch_2.bin", 1, 3, {1, 10, 2});
  auto data = LoadCifar10(dir);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr("data_batch_2.bin: record 1 has label 10"));
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

// Values of the default 1x28x28 set that bench/torch_ddp.py's Python recipe
// (torch.Generator().manual_seed(7)) produces: the C++ set must stay
// bit-identical to it.
TEST(SyntheticDatasetTest, DefaultShapeMatchesThePythonRecipe) {
  ImageDataset data = MakeSyntheticDataset(6, 7);
  ASSERT_EQ(data.images.sizes(), (std::vector<int64_t>{6, 1, 28, 28}));
  EXPECT_TRUE(torch::equal(data.labels,
                           torch::tensor({9, 4, 2, 4, 8, 1}, torch::kInt64)));
  EXPECT_FLOAT_EQ(data.images[0][0][0][0].item<float>(), 0.66128701f);
  EXPECT_FLOAT_EQ(data.images[5][0][27][27].item<float>(), 0.0839771405f);
  EXPECT_FLOAT_EQ(data.images[3][0][10][17].item<float>(), 0.813302994f);
  EXPECT_NEAR(data.images.to(torch::kFloat64).sum().item<double>(),
              2354.89362491, 1e-6);
}

TEST(SyntheticDatasetTest, OtherShapesFollowTheSameRecipe) {
  ImageDataset a = MakeSyntheticDataset(32, 5, {3, 32, 32});
  ImageDataset b = MakeSyntheticDataset(32, 5, {3, 32, 32});
  EXPECT_EQ(a.images.sizes(), (std::vector<int64_t>{32, 3, 32, 32}));
  EXPECT_TRUE(torch::equal(a.images, b.images));
  EXPECT_GE(a.images.min().item<float>(), 0.0f);
  EXPECT_LE(a.images.max().item<float>(), 1.0f);
  EXPECT_GE(a.labels.min().item<int64_t>(), 0);
  EXPECT_LT(a.labels.max().item<int64_t>(), 10);
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
