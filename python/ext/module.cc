// gradsync._C: the extension module of the gradsync Python package, built
// against the installed torch. It offers gradsync's process groups to
// torch.distributed (gradsync/torch.py registers the backend "gradsync"),
// runs a Python training loop as a member of a job (job.h), and makes
// gradsync.torch.Store's key-value calls (key_value.h).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/mutex_checks.h"
#include "python/ext/global_batch.h"
#include "python/ext/job.h"
#include "python/ext/key_value.h"
#include "python/ext/membership.h"
#include "worker/torch/c10d_store.h"
#include "worker/torch/process_group.h"

namespace py = pybind11;

namespace gradsync {
namespace {

// A BlockingWait that releases the GIL around `wait` when the calling
// thread holds it: Python drops a group's last reference with the GIL
// held, and the group's completing thread may be running a future's
// Python callback.
void ReleasingTheGil(const std::function<void()>& wait) {
  if (PyGILState_Check() == 0) {
    wait();
    return;
  }
  py::gil_scoped_release unlocked;
  wait();
}

// The group torch.distributed asks the backend "gradsync" for (its creator
// function: store, rank, world size, timeout), bootstrapped through
// `store` with the GIL released. The environment chooses the transport:
// GRADSYNC_SHARED_MEMORY=0 for Gloo on one host too, GRADSYNC_GLOO_ADDRESS
// for the address Gloo binds. RuntimeError naming the failure.
c10::intrusive_ptr<c10d::ProcessGroup> CreateProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout) {
  TorchGroupOptions options;
  options.timeout = absl::FromChrono(timeout);
  const char* shared_memory = std::getenv("GRADSYNC_SHARED_MEMORY");
  options.shared_memory =
      shared_memory == nullptr || std::string(shared_memory) != "0";
  const char* address = std::getenv("GRADSYNC_GLOO_ADDRESS");
  if (address != nullptr) options.gloo_address = address;
  options.blocking_wait = &ReleasingTheGil;
  C10dStore bootstrap(store);
  absl::StatusOr<c10::intrusive_ptr<TorchProcessGroup>> group;
  {
    py::gil_scoped_release unlocked;
    group = CreateTorchProcessGroup(&bootstrap, rank, world_size, options);
  }
  if (!group.ok()) {
    throw std::runtime_error(absl::StrCat(
        "gradsync process group (rank ", rank, " of ", world_size,
        "): ", group.status().ToString()));
  }
  return *group;
}

TorchProcessGroup& Gradsync(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  auto* ours = dynamic_cast<TorchProcessGroup*>(group.get());
  if (ours == nullptr) {
    throw std::invalid_argument(absl::StrCat(
        "not a gradsync process group (", group->getBackendName(), ")"));
  }
  return *ours;
}

}  // namespace
}  // namespace gradsync

PYBIND11_MODULE(_C, m) {
  // This module's code is compiled with NDEBUG: common/mutex_checks.h.
  gradsync::ConfigureMutexChecks();
  m.doc() =
      "gradsync's native part: its process groups for torch.distributed, and "
      "its job runtime for training loops in Python (gradsync.elastic)";
  gradsync::RegisterJob(m);
  gradsync::RegisterGlobalBatchPlan(m);
  gradsync::RegisterMembership(m);
  gradsync::RegisterKeyValue(m);
  m.def("create_process_group", &gradsync::CreateProcessGroup,
        py::arg("store"), py::arg("rank"), py::arg("world_size"),
        py::arg("timeout"),
        "The process group of backend 'gradsync' (torch.distributed's "
        "creator function).");
  m.def(
      "transport",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        return gradsync::Gradsync(group).transport();
      },
      py::arg("group"), "'shm' or 'gloo': the backend under a gradsync group.");
  m.def(
      "abort",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        gradsync::Gradsync(group).Abort();
      },
      py::arg("group"),
      "Fails the collective in flight and every later one, here and at the "
      "peers in one with this rank; the group is unusable afterwards.",
      py::call_guard<py::gil_scoped_release>());
}
