#include "worker/data/datasets.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// CIFAR-10's binary version: at most 5 training batches of records of one
// label byte and 3x32x32 pixel bytes.
constexpr int kCifarBatches = 5;
constexpr int64_t kCifarPixels = 3 * 32 * 32;
constexpr int64_t kCifarRecordBytes = 1 + kCifarPixels;

std::string CifarBatchPath(const std::string& dir, int index) {
  return absl::StrCat(dir, "/data_batch_", index, ".bin");
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// How many files data_batch_1.bin, data_batch_2.bin, ... `dir` holds: at
// least 1, with no file missing before a later one.
absl::StatusOr<int> CountCifarBatches(const std::string& dir) {
  int count = 0;
  while (count < kCifarBatches && Exists(CifarBatchPath(dir, count + 1))) {
    ++count;
  }
  if (count == 0) {
    return absl::NotFoundError(absl::StrCat(
        "CIFAR-10 file ", CifarBatchPath(dir, 1),
        " is missing (--data_dir must hold the files of CIFAR-10's binary "
        "version, cifar-10-batches-bin)"));
  }
  for (int later = count + 2; later <= kCifarBatches; ++later) {
    if (Exists(CifarBatchPath(dir, later))) {
      return absl::NotFoundError(absl::StrCat(
          "CIFAR-10 file ", CifarBatchPath(dir, count + 1), " is missing but ",
          CifarBatchPath(dir, later),
          " is there: restore it, or remove the batches after it"));
    }
  }
  return count;
}

// The records of the CIFAR-10 batch file `path`, as [N, 3073] bytes whose
// labels are checked.
absl::StatusOr<torch::Tensor> ReadCifarBatch(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) {
    return absl::DataLossError(
        absl::StrCat("cannot read CIFAR-10 file ", path));
  }
  const std::streamoff bytes = file.tellg();
  if (bytes <= 0 || bytes % kCifarRecordBytes != 0) {
    return absl::DataLossError(absl::StrCat(
        "CIFAR-10 file ", path, " holds ", bytes, " bytes, not a positive "
        "whole number of ", kCifarRecordBytes, "-byte records: download and "
        "unpack cifar-10-binary.tar.gz again"));
  }
  torch::Tensor records = torch::empty(
      {bytes / kCifarRecordBytes, kCifarRecordBytes}, torch::kUInt8);
  file.seekg(0);
  file.read(static_cast<char*>(records.data_ptr()), bytes);
  if (!file) {
    return absl::DataLossError(
        absl::StrCat("cannot read CIFAR-10 file ", path));
  }
  auto [label, record] = records.select(1, 0).max(0);
  if (label.item<int64_t>() > 9) {
    return absl::DataLossError(absl::StrCat(
        "CIFAR-10 file ", path, ": record ", record.item<int64_t>(),
        " has label ", label.item<int64_t>(), " (labels are 0 to 9): the "
        "file is corrupt or not CIFAR-10's; download it again"));
  }
  return records;
}

// {n} followed by `shape`.
std::vector<int64_t> Prepend(int64_t n, const std::vector<int64_t>& shape) {
  std::vector<int64_t> result = {n};
  result.insert(result.end(), shape.begin(), shape.end());
  return result;
}

}  // namespace

absl::StatusOr<ImageDataset> LoadMnist(const std::string& dir) {
  for (const char* file : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}) {
    const std::string path = absl::StrCat(dir, "/", file);
    if (!std::ifstream(path).good()) {
      return absl::NotFoundError(absl::StrCat(
          "MNIST file ", path, " is missing (--data_dir must hold the "
          "uncompressed IDX files)"));
    }
  }
  try {
    torch::data::datasets::MNIST mnist(dir,
                                       torch::data::datasets::MNIST::Mode::kTrain);
    return ImageDataset{mnist.images(), mnist.targets()};
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat("cannot read MNIST from ", dir,
                                            ": ", e.what_without_backtrace()));
  }
}

absl::StatusOr<ImageDataset> LoadCifar10(const std::string& dir) {
  GS_ASSIGN_OR_RETURN(const int count, CountCifarBatches(dir));
  std::vector<torch::Tensor> batches;
  for (int index = 1; index <= count; ++index) {
    GS_ASSIGN_OR_RETURN(torch::Tensor batch,
                        ReadCifarBatch(CifarBatchPath(dir, index)));
    batches.push_back(std::move(batch));
  }
  // Converted after concatenating, so the float32 images (600 MB for the
  // real set) are never held twice.
  torch::Tensor records = torch::cat(batches);
  ImageDataset data;
  data.labels = records.select(1, 0).to(torch::kInt64);
  data.images = records.narrow(1, 1, kCifarPixels)
                    .reshape({-1, 3, 32, 32})
                    .to(torch::kFloat32)
                    .div_(255);
  return data;
}

ImageDataset MakeSyntheticDataset(int64_t size, uint64_t seed,
                                  std::vector<int64_t> shape) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  // Each class has a random prototype image; a sample is its class's
  // prototype blended with uniform noise.
  torch::Tensor prototypes = torch::rand(Prepend(10, shape), generator);
  ImageDataset data;
  data.labels = torch::randint(0, 10, {size}, generator, torch::kInt64);
  data.images = 0.35 * prototypes.index_select(0, data.labels) +
                0.65 * torch::rand(Prepend(size, shape), generator);
  return data;
}

}  // namespace gradsync
