// A module's buffers as they were at one moment (a step's start), to put
// back when what came after is dropped.
#ifndef GRADSYNC_WORKER_DDP_BUFFER_SNAPSHOT_H_
#define GRADSYNC_WORKER_DDP_BUFFER_SNAPSHOT_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <vector>

namespace gradsync {

// A forward moves a module's buffers (BatchNorm's running statistics and
// batch counter) before the step it belongs to is known to be good; a step
// that is dropped (a collective failed) must leave no trace, since the
// re-formed round copies a survivor's state to every rank and trains the
// step again. Take() at a step's start, Clear() once it committed, Restore()
// when it failed. One flat copy per dtype and device: two copies a step for
// a ResNet, none for a module without buffers. Not thread-safe; the module's
// buffers must outlive a snapshot that holds them.
class BufferSnapshot {
 public:
  // Copies `module`'s buffers (recursively) as they are now, replacing what
  // was held.
  void Take(const torch::nn::Module& module);
  // Writes the copies back into the buffers they were taken from, then
  // forgets them. Nothing when none are held.
  void Restore();
  // Forgets the copies (the step committed).
  void Clear() { groups_.clear(); }
  bool held() const { return !groups_.empty(); }

 private:
  // Buffers of one dtype and device, and their values, flattened in order.
  struct Group {
    std::vector<torch::Tensor> buffers;
    torch::Tensor values;
  };
  std::vector<Group> groups_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_BUFFER_SNAPSHOT_H_
