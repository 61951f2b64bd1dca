// gradsync._C's GlobalBatchPlan: the C++ trainer's rules for an exact global
// batch (worker/data/global_batch.h), for a Python loop whose rounds change
// size (gradsync.elastic.micro_batches).
#ifndef GRADSYNC_PYTHON_EXT_GLOBAL_BATCH_H_
#define GRADSYNC_PYTHON_EXT_GLOBAL_BATCH_H_

#include <pybind11/pybind11.h>

namespace gradsync {

// Adds GlobalBatchPlan to `module`. Its calls raise ValueError for
// arguments outside the plan (a rank not in the world, shares that do not
// divide a step, a micro-batch or a step beyond the epoch's) and change no
// state: a plan is immutable.
void RegisterGlobalBatchPlan(pybind11::module_& module);

}  // namespace gradsync

#endif  // GRADSYNC_PYTHON_EXT_GLOBAL_BATCH_H_
