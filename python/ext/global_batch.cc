#include "python/ext/global_batch.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/data/global_batch.h"

namespace py = pybind11;

namespace gradsync {
namespace {

// std::invalid_argument (ValueError) with the status's message.
void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw std::invalid_argument(status.ToString());
}

void CheckWorld(int world) {
  if (world < 1) {
    throw std::invalid_argument(
        absl::StrCat("a world of ", world, " ranks: it needs at least 1"));
  }
}

GlobalBatchPlan Create(int64_t global_batch, int64_t micro_batch,
                       int64_t epoch_size) {
  absl::StatusOr<GlobalBatchPlan> plan =
      GlobalBatchPlan::Create(global_batch, micro_batch, epoch_size);
  ThrowIfError(plan.status());
  return *plan;
}

py::tuple Share(const GlobalBatchPlan& plan, int rank, int world,
                const std::vector<int>& shares) {
  CheckWorld(world);
  if (rank < 0 || rank >= world) {
    throw std::invalid_argument(
        absl::StrCat("rank ", rank, " is not in [0, ", world, ")"));
  }
  absl::StatusOr<MicroBatchShare> share = plan.Share(rank, world, shares);
  ThrowIfError(share.status());
  return py::make_tuple(share->first, share->count);
}

// Refuses a step that does not begin a step of the epoch and a micro-batch
// the step does not have: positions past them would be another step's
// samples, or none of the epoch's.
py::tuple MicroBatchSpan(const GlobalBatchPlan& plan, int64_t step_start,
                         int64_t j) {
  ThrowIfError(plan.CheckStepStart(step_start));
  if (j < 0 || j >= plan.micro_batches_per_step()) {
    throw std::invalid_argument(
        absl::StrCat("micro-batch ", j, " is not in [0, ",
                     plan.micro_batches_per_step(), ") of a step"));
  }
  const SampleSpan span = plan.MicroBatchSpan(step_start, j);
  return py::make_tuple(span.begin, span.end);
}

double LossDivisor(const GlobalBatchPlan& plan, int world) {
  CheckWorld(world);
  return plan.LossDivisor(world);
}

}  // namespace

void RegisterGlobalBatchPlan(py::module_& m) {
  py::class_<GlobalBatchPlan>(m, "GlobalBatchPlan")
      .def(py::init(&Create), py::arg("global_batch"), py::arg("micro_batch"),
           py::arg("epoch_size"))
      .def_property_readonly("global_batch", &GlobalBatchPlan::global_batch)
      .def_property_readonly("micro_batch", &GlobalBatchPlan::micro_batch)
      .def_property_readonly("micro_batches_per_step",
                             &GlobalBatchPlan::micro_batches_per_step)
      .def_property_readonly("steps_per_epoch",
                             &GlobalBatchPlan::steps_per_epoch)
      .def("share", &Share, py::arg("rank"), py::arg("world_size"),
           py::arg("shares") = std::vector<int>(),
           "(first, count): the step's micro-batches rank `rank` runs.")
      .def("micro_batch_span", &MicroBatchSpan, py::arg("step_start"),
           py::arg("j"),
           "(begin, end): the epoch-order positions of micro-batch j of the "
           "step beginning at position step_start.")
      .def("loss_divisor", &LossDivisor, py::arg("world_size"),
           "What a rank of a round of world_size ranks divides the sum of "
           "its samples' losses by: global_batch / world_size.");
}

}  // namespace gradsync
