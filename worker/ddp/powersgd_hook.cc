#include "worker/ddp/powersgd_hook.h"

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// Gram-Schmidt on the columns of `m` (n x r, contiguous), in place: what
// PyTorch's _orthogonalize_gram_schmidt does (QR, which PyTorch uses for
// r > 2, spans the same space, and P P^T M does not depend on the basis).
void Orthogonalize(torch::Tensor m, double epsilon) {
  const int64_t columns = m.size(1);
  for (int64_t i = 0; i < columns; ++i) {
    torch::Tensor column = m.narrow(1, i, 1);
    torch::Tensor norm = column.norm();
    column.div_(epsilon == 0 ? norm : norm + epsilon);
    if (i + 1 < columns) {
      torch::Tensor rest = m.narrow(1, i + 1, columns - i - 1);
      rest.sub_((column * rest).sum(0, /*keepdim=*/true) * column);
    }
  }
}

// An all-reduce of `t`, or nothing when it is empty (the same on every rank:
// sizes follow the bucket layout).
std::shared_ptr<Work> AllReduceUnlessEmpty(Backend* backend,
                                           const torch::Tensor& t) {
  if (t.numel() == 0) return Work::Done(0, absl::OkStatus());
  return AllReduceTensor(backend, t, ReduceOp::kSum);
}

// One compressed gradient: the matrix (a view of the bucket) and its
// factors (views of the bucket's P and Q memory).
struct Factors {
  torch::Tensor matrix;  // n x m
  torch::Tensor p;       // n x r
  torch::Tensor q;       // m x r
};

// A bucket's gradients sorted by whether compressing them pays (PyTorch's
// _should_compress: rank-r factors of an n x m matrix, (n + m) r elements,
// times min_rate, fewer than its n m).
struct Split {
  std::vector<torch::Tensor> matrices;  // n x m views of the gradients
  std::vector<int64_t> ranks;           // each matrix's r
  std::vector<torch::Tensor> uncompressed;
  int64_t p_size = 0, q_size = 0;       // elements of all Ps, all Qs
  int64_t elements_before = 0, elements_after = 0;
};

Split SplitGradients(const std::vector<torch::Tensor>& gradients,
                     int64_t max_rank, double min_rate) {
  Split split;
  for (const torch::Tensor& grad : gradients) {
    if (grad.dim() == 0) {
      split.uncompressed.push_back(grad);
      split.elements_before += 1;
      split.elements_after += 1;
      continue;
    }
    torch::Tensor matrix = grad.view({grad.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t r = std::min<int64_t>({n, m, max_rank});
    split.elements_before += n * m;
    if ((n + m) * r * min_rate < n * m) {
      split.matrices.push_back(matrix);
      split.ranks.push_back(r);
      split.p_size += n * r;
      split.q_size += m * r;
      split.elements_after += (n + m) * r;
    } else {
      split.uncompressed.push_back(grad);
      split.elements_after += n * m;
    }
  }
  return split;
}

// `tensors` end to end in one new tensor (empty for none).
torch::Tensor Flatten(const std::vector<torch::Tensor>& tensors,
                      const torch::TensorOptions& options) {
  if (tensors.empty()) return torch::empty({0}, options);
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  return torch::cat(flat);
}

// Each matrix of `split` with its P and Q: views of `p` and `q` in order.
std::shared_ptr<std::vector<Factors>> FactorViews(const Split& split,
                                                  const torch::Tensor& p,
                                                  const torch::Tensor& q) {
  auto factors = std::make_shared<std::vector<Factors>>();
  int64_t p_at = 0, q_at = 0;
  for (size_t i = 0; i < split.matrices.size(); ++i) {
    const int64_t n = split.matrices[i].size(0), m = split.matrices[i].size(1);
    const int64_t r = split.ranks[i];
    factors->push_back({split.matrices[i], p.narrow(0, p_at, n * r).view({n, r}),
                        q.narrow(0, q_at, m * r).view({m, r})});
    p_at += n * r;
    q_at += m * r;
  }
  return factors;
}

// What the three all-reduces of a compressed bucket work on, once P = M Q
// is computed for every matrix.
struct Stages {
  torch::Tensor input;              // the bucket
  torch::Tensor flat_uncompressed;  // the uncompressed gradients, end to end
  std::vector<torch::Tensor> uncompressed;
  std::shared_ptr<std::vector<Factors>> factors;
  torch::Tensor p, q;               // all factors' memory
  double divisor = 1;
  double epsilon = 0;
  // With error feedback: the error-corrected local gradient, and where the
  // new error goes.
  torch::Tensor local;
  torch::Tensor* error = nullptr;
};

// Stage 1 sums the uncompressed gradients (and averages them), stage 2 P
// (orthogonalized: no division; then Q = M^T P), stage 3 Q (averaged); the
// bucket becomes P Q^T.
BucketFuture ReduceInStages(Backend* backend, const Stages& s) {
  return BucketFuture::After(
      AllReduceUnlessEmpty(backend, s.flat_uncompressed),
      [backend, s]() -> absl::StatusOr<BucketFuture> {
        torch::NoGradGuard no_grad;
        s.flat_uncompressed.div_(s.divisor);
        int64_t at = 0;
        for (const torch::Tensor& t : s.uncompressed) {
          t.copy_(s.flat_uncompressed.narrow(0, at, t.numel()).view_as(t));
          at += t.numel();
        }
        return BucketFuture::After(
            AllReduceUnlessEmpty(backend, s.p),
            [backend, s]() -> absl::StatusOr<BucketFuture> {
              torch::NoGradGuard no_grad;
              for (Factors& f : *s.factors) {
                Orthogonalize(f.p, s.epsilon);
                torch::mm_out(f.q, f.matrix.t(), f.p);
              }
              return BucketFuture::After(
                  AllReduceUnlessEmpty(backend, s.q),
                  [s]() -> absl::StatusOr<BucketFuture> {
                    torch::NoGradGuard no_grad;
                    s.q.div_(s.divisor);
                    for (Factors& f : *s.factors) {
                      torch::mm_out(f.matrix, f.p, f.q.t());
                    }
                    if (s.error != nullptr) *s.error = s.local - s.input;
                    return BucketFuture::Value(s.input);
                  });
            });
      });
}

}  // namespace

absl::StatusOr<std::shared_ptr<PowerSgdHook>> PowerSgdHook::Create(
    const PowerSgdOptions& options) {
  if (options.matrix_approximation_rank < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PowerSGD's matrix approximation rank must be at least 1, got ",
        options.matrix_approximation_rank));
  }
  if (options.min_compression_rate < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PowerSGD's min compression rate must be at least 1, got ",
        options.min_compression_rate));
  }
  if (options.orthogonalization_epsilon < 0) {
    return absl::InvalidArgumentError(
        "PowerSGD's orthogonalization epsilon must not be negative");
  }
  if ((options.use_error_feedback || options.warm_start) &&
      options.start_iter < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PowerSGD with error feedback or warm start must start at step 2 or "
        "later (DDP rebuilds its buckets after step 1), got start iteration ",
        options.start_iter));
  }
  return std::shared_ptr<PowerSgdHook>(new PowerSgdHook(options));
}

void PowerSgdHook::ResumeAt(int64_t iteration) {
  iteration_ = iteration;
  first_compressed_ = std::max(options_.start_iter, iteration + 1);
  buckets_.clear();
}

void PowerSgdHook::CountStep(const GradBucket& bucket) {
  if (bucket.is_last) ++iteration_;
}

BucketFuture PowerSgdHook::Run(Backend* backend, GradBucket& bucket) {
  if (iteration_ < first_compressed_) {
    CountStep(bucket);
    return AllReduceHook().Run(backend, bucket);
  }
  BucketFuture future = Compress(backend, bucket);
  CountStep(bucket);
  return future;
}

BucketFuture PowerSgdHook::Compress(Backend* backend, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  BucketState& state = buckets_[bucket.index];  // std::map entries do not move
  Stages stages;
  stages.input = bucket.buffer;
  stages.divisor = static_cast<double>(bucket.divisor);
  stages.epsilon = options_.orthogonalization_epsilon;
  if (options_.use_error_feedback) {
    if (state.error.defined() && state.error.numel() == stages.input.numel()) {
      stages.input.add_(state.error);
    } else {
      state.error = torch::zeros_like(stages.input);
    }
    stages.local = stages.input.clone();
    stages.error = &state.error;
  }
  Split split = SplitGradients(bucket.gradients,
                               options_.matrix_approximation_rank,
                               options_.min_compression_rate);
  elements_before_ += split.elements_before;
  elements_after_ += split.elements_after;
  stages.flat_uncompressed = Flatten(split.uncompressed, stages.input.options());
  const bool fresh = !options_.warm_start || !state.p.defined() ||
                     state.p.numel() != split.p_size ||
                     state.q.numel() != split.q_size;
  if (fresh) {
    state.p = torch::empty({split.p_size}, stages.input.options());
    state.q = torch::empty({split.q_size}, stages.input.options());
  }
  stages.p = state.p;
  stages.q = state.q;
  stages.factors = FactorViews(split, state.p, state.q);
  for (Factors& f : *stages.factors) {
    if (fresh) {
      // The same draws on every rank: a generator seeded by a counter.
      torch::Generator generator = at::detail::createCPUGenerator(
          options_.random_seed + draws_++);
      f.q.copy_(torch::randn(f.q.sizes(), generator,
                             torch::TensorOptions().dtype(stages.input.dtype())));
    }
    Orthogonalize(f.q, stages.epsilon);
    torch::mm_out(f.p, f.matrix, f.q);
  }
  bucket.wire_bytes = (stages.flat_uncompressed.numel() + split.p_size +
                       split.q_size) *
                      stages.input.element_size();
  stages.uncompressed = std::move(split.uncompressed);
  return ReduceInStages(backend, stages);
}

}  // namespace gradsync
