// PowerSGD (Vogels et al., NeurIPS 2019) as PyTorch's powerSGD_hook runs it:
// each gradient matrix M (n x m, a parameter viewed as [size(0), -1]) is
// sent as two thin factors, P = M Q (n x r) and Q = M^T P (m x r), one power
// iteration per step, with error feedback (what compression lost is added
// to the next step's gradient) and warm start (Q is kept from the last
// step). Tensors that would not shrink by min_compression_rate (biases,
// small layers) are all-reduced as they are. The first start_iter steps use
// a plain all-reduce.
#ifndef GRADSYNC_WORKER_DDP_POWERSGD_HOOK_H_
#define GRADSYNC_WORKER_DDP_POWERSGD_HOOK_H_

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "worker/ddp/comm_hook.h"

namespace gradsync {

// PyTorch's PowerSGDState settings, with its defaults.
struct PowerSgdOptions {
  // r, the rank of the approximation (PyTorch's matrix_approximation_rank).
  int matrix_approximation_rank = 1;
  // Steps that run a plain all-reduce first (start_powerSGD_iter). At least
  // 2 with error feedback or warm start: buckets are rebuilt after step 1.
  int64_t start_iter = 1000;
  // A matrix is compressed only when (n + m) * r * rate < n * m.
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  bool warm_start = true;
  // Added to every column norm when orthogonalizing (0: none).
  double orthogonalization_epsilon = 0;
  // Seeds the random initial Qs; every rank must use the same.
  uint64_t random_seed = 0;
};

// Thread-compatible: one DDP model drives it (see CommHook). Holds per
// bucket the error feedback and the warm-start factors, keyed by bucket
// index: the bucket layout must not change after start_iter (DDP rebuilds
// its buckets once, after step 1).
class PowerSgdHook final : public CommHook {
 public:
  // INVALID_ARGUMENT for a rank < 1, a rate < 1, a negative epsilon, or a
  // start_iter < 2 with error feedback or warm start.
  static absl::StatusOr<std::shared_ptr<PowerSgdHook>> Create(
      const PowerSgdOptions& options);

  std::string name() const override { return "powersgd"; }
  BucketFuture Run(Backend* backend, GradBucket& bucket) override;

  // Continues a job's count of synchronized steps at `iteration` (the steps
  // committed before this hook: a new round's hook, or a resumed job's),
  // with fresh error feedback and factors on every rank. Compression starts
  // at start_iter, but no earlier than the second step from here: the first
  // runs before DDP rebuilds its buckets. Call before the first step, with
  // the same value on every rank.
  void ResumeAt(int64_t iteration);

  // Synchronized steps seen so far (counted at each step's last bucket).
  int64_t iteration() const { return iteration_; }
  // Elements before and after compression, summed over every compressed
  // step's buckets (PyTorch's compression_stats).
  int64_t elements_before() const { return elements_before_; }
  int64_t elements_after() const { return elements_after_; }

 private:
  explicit PowerSgdHook(const PowerSgdOptions& options)
      : options_(options), first_compressed_(options.start_iter) {}

  struct BucketState {
    torch::Tensor error;  // error feedback, the bucket's size
    torch::Tensor p;      // every compressed matrix's P, flat
    torch::Tensor q;      // and Q
  };

  BucketFuture Compress(Backend* backend, GradBucket& bucket);
  void CountStep(const GradBucket& bucket);

  const PowerSgdOptions options_;
  std::map<size_t, BucketState> buckets_;
  int64_t iteration_ = 0;
  // The first iteration that compresses.
  int64_t first_compressed_;
  // Draws of random initial Qs so far: seeds the next one with
  // random_seed + draws, the same sequence on every rank.
  uint64_t draws_ = 0;
  int64_t elements_before_ = 0;
  int64_t elements_after_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_POWERSGD_HOOK_H_
