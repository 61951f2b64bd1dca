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
  ImageDataset data;
  data.images = torch::rand({size, 1, 28, 28}, generator);
  torch::Tensor teacher = torch::randn({28 * 28, 10}, generator);
  data.labels =
      torch::matmul(data.images.reshape({size, 28 * 28}) - 0.5, teacher)
          .argmax(1);
  return data;
}

}  // namespace gradsync
