// The few autograd calls whose API differs between LibTorch versions, kept
// in one place. Built and tested against LibTorch 1.13 (Debian) only; 2.x
// (GPU machines) also has grad accumulators with post hooks and the engine's
// end-of-backward callback queue, but this file has never been compiled
// against it.
#ifndef GRADSYNC_WORKER_DDP_AUTOGRAD_HOOKS_H_
#define GRADSYNC_WORKER_DDP_AUTOGRAD_HOOKS_H_

#include <torch/torch.h>

#include <functional>
#include <memory>

namespace gradsync {

// Runs `hook` each time a backward pass has accumulated a gradient into
// `param` (a leaf that requires grad), on the thread running that part of
// backward. Returns the grad accumulator node: autograd holds it weakly, so
// the caller keeps it alive for as long as the hook must fire.
std::shared_ptr<torch::autograd::Node> AddPostAccumulateHook(
    const torch::Tensor& param, std::function<void()> hook);

// Runs `callback` when the backward pass that is running now finishes. Call
// only from inside a backward hook. An exception the callback throws is
// rethrown by the backward() call.
void QueueEndOfBackwardCallback(std::function<void()> callback);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_AUTOGRAD_HOOKS_H_
