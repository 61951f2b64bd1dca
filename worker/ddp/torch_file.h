// Files that torch.save and torch.load exchange: a zip archive holding a
// pickled object (data.pkl) and one record per tensor storage.
//
// LibTorch's own torch::pickle_load cannot read what PyTorch users save most:
// a state dict is a collections.OrderedDict, which LibTorch's unpickler
// turns into None (it expects OrderedDicts only as tensors' empty hook
// lists), so torch.save(ddp.state_dict()) does not load. ReadTorchFile reads
// the subset of pickle that torch.save and torch::pickle_save write, with
// OrderedDicts as ordered dicts.
#ifndef GRADSYNC_WORKER_DDP_TORCH_FILE_H_
#define GRADSYNC_WORKER_DDP_TORCH_FILE_H_

#include <ATen/core/ivalue.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsync {

// Reads a file torch.save (zip format, PyTorch 1.6 and later) or
// torch::pickle_save wrote. Values: dicts (OrderedDicts too: ordered
// GenericDicts with any key type), lists, tuples, tensors (Parameters as
// tensors; CPU, storages shared as in the file), strings, ints, floats,
// bools and None. NOT_FOUND for a missing file; DATA_LOSS for a file that
// is not such an archive, or that holds objects outside that subset (named).
absl::StatusOr<c10::IValue> ReadTorchFile(const std::string& path);

// Writes `value` (dicts, lists, tuples, tensors, scalars, strings) as
// torch::pickle_save does but without its type tags (lists and dicts as plain
// pickle ones), so that torch.load reads it, weights_only=True (PyTorch's
// default from 2.6) included, and atomically: to a
// temporary file beside `path`, flushed to disk (fsync), then renamed over
// `path`, and the directory synced, so a crash leaves the old file or the
// new one, never a part. INTERNAL naming the path on failure.
absl::Status WriteTorchFile(const c10::IValue& value, const std::string& path);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DDP_TORCH_FILE_H_
