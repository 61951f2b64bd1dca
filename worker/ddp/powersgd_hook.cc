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
  torch::Tensor input = bucket.buffer;
  const double divisor = static_cast<double>(bucket.divisor);
  BucketState& state = buckets_[bucket.index];
  torch::Tensor local;  // the error-corrected local gradient, for feedback
  if (options_.use_error_feedback) {
    if (state.error.defined() && state.error.numel() == input.numel()) {
      input.add_(state.error);
    } else {
      state.error = torch::zeros_like(input);
    }
    local = input.clone();
  }

  // Which gradients are worth compressing (PyTorch's _should_compress).
  std::vector<torch::Tensor> matrices, uncompressed;
  std::vector<int64_t> ranks;
  int64_t p_size = 0, q_size = 0;
  for (const torch::Tensor& grad : bucket.gradients) {
    if (grad.dim() == 0) {
      uncompressed.push_back(grad);
      elements_before_ += 1;
      elements_after_ += 1;
      continue;
    }
    torch::Tensor matrix = grad.view({grad.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t r =
        std::min<int64_t>({n, m, options_.matrix_approximation_rank});
    elements_before_ += n * m;
    if ((n + m) * r * options_.min_compression_rate < n * m) {
      matrices.push_back(matrix);
      ranks.push_back(r);
      p_size += n * r;
      q_size += m * r;
      elements_after_ += (n + m) * r;
    } else {
      uncompressed.push_back(grad);
      elements_after_ += n * m;
    }
  }
  torch::Tensor flat_uncompressed;
  if (uncompressed.empty()) {
    flat_uncompressed = torch::empty({0}, input.options());
  } else {
    std::vector<torch::Tensor> flat;
    for (const torch::Tensor& t : uncompressed) flat.push_back(t.reshape({-1}));
    flat_uncompressed = torch::cat(flat);
  }

  const bool fresh = !options_.warm_start || !state.p.defined() ||
                     state.p.numel() != p_size || state.q.numel() != q_size;
  if (fresh) {
    state.p = torch::empty({p_size}, input.options());
    state.q = torch::empty({q_size}, input.options());
  }
  auto factors = std::make_shared<std::vector<Factors>>();
  int64_t p_at = 0, q_at = 0;
  for (size_t i = 0; i < matrices.size(); ++i) {
    const int64_t n = matrices[i].size(0), m = matrices[i].size(1);
    const int64_t r = ranks[i];
    factors->push_back({matrices[i], state.p.narrow(0, p_at, n * r).view({n, r}),
                        state.q.narrow(0, q_at, m * r).view({m, r})});
    p_at += n * r;
    q_at += m * r;
  }
  for (Factors& f : *factors) {
    if (fresh) {
      // The same draws on every rank: a generator seeded by a counter.
      torch::Generator generator = at::detail::createCPUGenerator(
          options_.random_seed + draws_++);
      f.q.copy_(torch::randn(f.q.sizes(), generator,
                             torch::TensorOptions().dtype(input.dtype())));
    }
    Orthogonalize(f.q, options_.orthogonalization_epsilon);
    torch::mm_out(f.p, f.matrix, f.q);
  }
  bucket.wire_bytes =
      (flat_uncompressed.numel() + p_size + q_size) * input.element_size();

  const double epsilon = options_.orthogonalization_epsilon;
  torch::Tensor p = state.p, q = state.q;
  BucketState* kept = &state;  // std::map entries do not move
  const bool feedback = options_.use_error_feedback;
  // Stage 1: the uncompressed tensors; then P.
  return BucketFuture::After(
      AllReduceUnlessEmpty(backend, flat_uncompressed),
      [=]() -> absl::StatusOr<BucketFuture> {
        torch::NoGradGuard no_grad;
        flat_uncompressed.div_(divisor);
        int64_t at = 0;
        for (const torch::Tensor& t : uncompressed) {
          t.copy_(flat_uncompressed.narrow(0, at, t.numel()).view_as(t));
          at += t.numel();
        }
        // Stage 2: P summed (it is orthogonalized, so no division); Q.
        return BucketFuture::After(
            AllReduceUnlessEmpty(backend, p),
            [=]() -> absl::StatusOr<BucketFuture> {
              torch::NoGradGuard no_grad;
              for (Factors& f : *factors) {
                Orthogonalize(f.p, epsilon);
                torch::mm_out(f.q, f.matrix.t(), f.p);
              }
              // Stage 3: Q averaged; the bucket becomes P Q^T.
              return BucketFuture::After(
                  AllReduceUnlessEmpty(backend, q),
                  [=]() -> absl::StatusOr<BucketFuture> {
                    torch::NoGradGuard no_grad;
                    q.div_(divisor);
                    for (Factors& f : *factors) {
                      torch::mm_out(f.matrix, f.p, f.q.t());
                    }
                    if (feedback) kept->error = local - input;
                    return BucketFuture::Value(input);
                  });
            });
      });
}

}  // namespace gradsync
