#include "worker/data/datasets.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace gradsync {

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

ImageDataset MakeSyntheticDataset(int64_t size, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  // Each class has a random prototype image; a sample is its class's
  // prototype blended with uniform noise.
  torch::Tensor prototypes = torch::rand({10, 1, 28, 28}, generator);
  ImageDataset data;
  data.labels = torch::randint(0, 10, {size}, generator, torch::kInt64);
  data.images = 0.35 * prototypes.index_select(0, data.labels) +
                0.65 * torch::rand({size, 1, 28, 28}, generator);
  return data;
}

}  // namespace gradsync
