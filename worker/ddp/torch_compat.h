// The LibTorch calls whose API differs between the versions gradsync builds
// against (Debian's 1.13 here, PyTorch 2.x on GPU machines), kept in one
// place. Checked against 1.13 by every build and against the headers of
// 2.6 (with CUDA) and 2.14 by deploy/torch_headers_check.sh: grad
// accumulators return std::shared_ptr<Node> up to 2.12 and
// c10::intrusive_ptr<Node> after; optimizers key a parameter's state by its
// TensorImpl's address as text in 1.13 and by the address itself from 2.2.
#ifndef GRADSYNC_WORKER_DDP_TORCH_COMPAT_H_
#define GRADSYNC_WORKER_DDP_TORCH_COMPAT_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace gradsync {

// A grad accumulator node as this LibTorch hands it out (an owning pointer).
using GradAccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(
    std::declval<const torch::Tensor&>()));

// Runs `hook` each time a backward pass has accumulated a gradient into
// `param` (a leaf that requires grad), on the thread running that part of
// backward. Returns the grad accumulator node: autograd holds it weakly, so
// the caller keeps it alive for as long as the hook must fire.
GradAccumulatorPtr AddPostAccumulateHook(const torch::Tensor& param,
                                         std::function<void()> hook);

// Runs `callback` when the backward pass that is running now finishes. Call
// only from inside a backward hook. An exception the callback throws is
// rethrown by the backward() call.
void QueueEndOfBackwardCallback(std::function<void()> callback);

// The optimizer's state of `param` (nullptr: none yet).
const torch::optim::OptimizerParamState* FindOptimizerState(
    const torch::optim::Optimizer& optimizer, const torch::Tensor& param);

// Replaces all of the optimizer's per-parameter state by `states` (each
// parameter with its state), as the optimizer's own step would find it.
void ReplaceOptimizerState(
    torch::optim::Optimizer& optimizer,
    std::vector<std::pair<torch::Tensor,
                          std::unique_ptr<torch::optim::OptimizerParamState>>>
        states);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_TORCH_COMPAT_H_
