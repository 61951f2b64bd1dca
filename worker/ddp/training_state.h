// Copying one rank's training state to every rank of a round: how a
// recovered round (survivors, a spare, a restarted process) gets back to one
// consistent state without a checkpoint file.
#ifndef GRADSYNC_WORKER_DDP_TRAINING_STATE_H_
#define GRADSYNC_WORKER_DDP_TRAINING_STATE_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"

namespace gradsync {

// Copies rank `root`'s training state to every rank of `backend`
// (collective: every rank calls it with the same root, module structure and
// counters length), in this order:
//  - `counters`: the training loop's own position (step, epoch, data
//    position, ...), overwritten on the other ranks;
//  - the module's parameters and buffers, copied into the module's own
//    tensors, so after the call every rank's parameters are bit-identical
//    to root's;
//  - the optimizer's state (e.g. SGD momentum), serialized with torch::save
//    on root and loaded on the others onto the parameters' device, so any
//    LibTorch optimizer works; the other ranks' old state is dropped first;
//  - the default CPU generator's state (dropout and other random ops), and
//    on a GPU also that device's default generator (a simulated GPU's
//    tensors are on the CPU: its generator is the CPU's).
// A receiving rank takes all of it in first (root's parameters and buffers
// into tensors of its own: a second copy of them while the call lasts) and
// applies it only once everything arrived, so that a transfer cut short (a
// peer lost, the root among them) leaves this rank's own state whole, at
// its own counters: a rank that failed here may still be the next round's
// source. Errors: INVALID_ARGUMENT for a root outside the world; the
// backend's status (UNAVAILABLE when a peer left, ...); INTERNAL when the
// optimizer state cannot be (de)serialized (a failed load leaves the
// optimizer's state empty). Each collective waits at most `timeout`.
absl::Status BroadcastTrainingState(Backend* backend, int root,
                                    torch::nn::Module& module,
                                    torch::optim::Optimizer& optimizer,
                                    std::vector<int64_t>* counters,
                                    absl::Duration timeout);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_TRAINING_STATE_H_
