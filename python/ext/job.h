// gradsync._C's part for in-place recovery: gradsync's C++ job runtime
// (RunJob, worker/runtime/run_job.h) driving a training loop written in
// Python (gradsync/elastic.py).
#ifndef GRADSYNC_PYTHON_EXT_JOB_H_
#define GRADSYNC_PYTHON_EXT_JOB_H_

#include <pybind11/pybind11.h>

namespace gradsync {

// Adds Trainer, Round and run_job to `module`.
void RegisterJob(pybind11::module_& module);

}  // namespace gradsync

#endif  // GRADSYNC_PYTHON_EXT_JOB_H_
