// The trainer's datasets, as in-memory tensors of 28x28 images: MNIST read
// from its IDX files, or a synthetic set with a learnable labelling.
#ifndef GRADSYNC_WORKER_DATA_DATASETS_H_
#define GRADSYNC_WORKER_DATA_DATASETS_H_

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

// Images [N, 1, 28, 28] float32 in [0, 1] and labels [N] int64 in [0, 10).
struct ImageDataset {
  torch::Tensor images;
  torch::Tensor labels;

  int64_t size() const { return labels.size(0); }
};

// MNIST's training split from `dir` (train-images-idx3-ubyte and
// train-labels-idx1-ubyte), read with LibTorch's reader: pixels scaled to
// [0, 1], nothing else. The reader wants the real training set (60,000
// images). NOT_FOUND when the files are missing, DATA_LOSS when they are
// malformed or of another size.
absl::StatusOr<ImageDataset> LoadMnist(const std::string& dir);

// `size` images in 10 classes, each a blend of its class's random prototype
// image (35%) and uniform noise (65%): noisy enough that the loss falls over
// a few hundred steps, clear enough that it does. The same `seed` gives the same set
// on every rank and every run; the global random state is left alone.
ImageDataset MakeSyntheticDataset(int64_t size, uint64_t seed);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DATA_DATASETS_H_
