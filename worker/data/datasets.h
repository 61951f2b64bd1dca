// The trainer's datasets, as in-memory tensors of images in 10 classes: MNIST
// (1x28x28) read from its IDX files, CIFAR-10 (3x32x32) read from its binary
// batches, or a synthetic set of any shape with a learnable labelling.
#ifndef GRADSYNC_WORKER_DATA_DATASETS_H_
#define GRADSYNC_WORKER_DATA_DATASETS_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsync {

// Images [N, C, H, W] float32 in [0, 1] (1x28x28 for MNIST, 3x32x32 for
// CIFAR-10, any shape for the synthetic set) and labels [N] int64 in
// [0, 10).
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

// CIFAR-10's training split from `dir`, in its binary version: files
// data_batch_1.bin, data_batch_2.bin, ... of records of 1 label byte then
// 3072 pixel bytes (channel-major 3x32x32, red, green, blue). The real set has
// 5 files of 10,000 records; any non-empty prefix data_batch_1..k is read (a
// subset, for tests). Images [N, 3, 32, 32] scaled to [0, 1]. NOT_FOUND naming
// data_batch_1.bin when it is missing, or a file missing before a later one;
// DATA_LOSS naming the file when one is empty or not a whole number of
// records, or holds a label above 9.
absl::StatusOr<ImageDataset> LoadCifar10(const std::string& dir);

// `size` images of `shape` ([C, H, W]) in 10 classes, each a blend of its
// class's random prototype image (35%) and uniform noise (65%): noisy enough
// that the loss falls over a few hundred steps, clear enough that it does.
// The same `seed` gives the same set on every rank and every run; the global
// random state is left alone. The default shape's set is bit-identical to
// bench/torch_ddp.py's Python recipe.
ImageDataset MakeSyntheticDataset(int64_t size, uint64_t seed,
                                  std::vector<int64_t> shape = {1, 28, 28});

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DATA_DATASETS_H_
