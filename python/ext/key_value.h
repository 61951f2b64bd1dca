// gradsync._C's key-value client: gradsync.torch.Store's calls through
// gradsync's C++ client (GrpcCoordinatorClient) instead of python3-grpcio,
// whose unary calls cost about twice as much from Python.
#ifndef GRADSYNC_PYTHON_EXT_KEY_VALUE_H_
#define GRADSYNC_PYTHON_EXT_KEY_VALUE_H_

#include <pybind11/pybind11.h>

namespace gradsync {

// Adds Client and KeyValue to `module`.
void RegisterKeyValue(pybind11::module_& module);

}  // namespace gradsync

#endif  // GRADSYNC_PYTHON_EXT_KEY_VALUE_H_
