#include "python/ext/job.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "worker/runtime/run_job.h"
#include "worker/torch/process_group.h"

namespace py = pybind11;

namespace gradsync {
namespace {

// One round as Python sees it (gradsync.elastic.Round): the values of the
// C++ Round, its torch process group over the round's backend, and its
// calls while the round lasts (Train's call); afterwards they raise.
class PyRound {
 public:
  PyRound(const Round* round, c10::intrusive_ptr<TorchProcessGroup> group)
      : round_(round), group_(std::move(group)) {}

  const Round& round() const {
    if (round_ == nullptr) {
      throw std::runtime_error(
          "gradsync: this round is over; use the round train() was given");
    }
    return *round_;
  }
  c10::intrusive_ptr<c10d::ProcessGroup> process_group() const {
    round();
    return group_;
  }
  void Report(int64_t step, int64_t samples, double loss,
              double step_seconds) const {
    StepReport report;
    report.step = step;
    report.loss = loss;
    report.step_time = absl::Seconds(step_seconds);
    absl::Status reported = round().report_step(report, samples);
    if (!reported.ok()) {
      throw std::runtime_error(absl::StrCat("gradsync: ", reported.ToString()));
    }
  }
  bool ReformRequested() const {
    return round().reform_requested ? round().reform_requested() : false;
  }
  void End() { round_ = nullptr; }

 private:
  const Round* round_;
  const c10::intrusive_ptr<TorchProcessGroup> group_;
};

// A gradsync.elastic.Trainer: C++ calls its Python methods.
class PyTrainer : public Trainer {
 public:
  using Trainer::Trainer;

  // Calls the Python train(round) over a torch process group of the round's
  // backend. A Python exception becomes the status of the collective that
  // failed first (a recoverable one re-forms the round) or, when none did,
  // INTERNAL with the exception's text (the job fails).
  absl::Status Train(const Round& round) override {
    auto group = c10::make_intrusive<TorchProcessGroup>(round.backend);
    auto py_round = std::make_shared<PyRound>(&round, group);
    absl::Status trained;
    {
      py::gil_scoped_acquire gil;
      try {
        py::function train = py::get_override(this, "train");
        if (!train) {
          trained = absl::UnimplementedError(
              "gradsync.elastic.Trainer subclasses must define train(round)");
        } else {
          train(py_round);
        }
      } catch (py::error_already_set& e) {
        const absl::Status collective = group->first_failure();
        trained = collective.ok()
                      ? absl::InternalError(absl::StrCat(
                            "the training loop raised ", e.what()))
                      : collective;
      }
      py_round->End();
    }
    group->End();
    return trained;
  }

  int64_t committed_step() const override {
    PYBIND11_OVERRIDE_PURE(int64_t, Trainer, committed_step, );
  }
  bool has_state() const override {
    PYBIND11_OVERRIDE(bool, Trainer, has_state, );
  }
};

// run_job(trainer, **options): RunJob with the GIL released.
void RunJobFromPython(Trainer* trainer, const std::string& coordinator,
                      const std::string& job, const std::string& nnodes,
                      int nproc_per_node, const std::string& node_id,
                      const std::string& failure_policy, bool shared_memory,
                      double timeout_seconds, int max_recoveries,
                      const std::string& token_file) {
  JobOptions options;
  options.coordinator = coordinator;
  options.job = job;
  options.nnodes = nnodes;
  options.nproc_per_node = nproc_per_node;
  options.node_id = node_id;
  options.backend = "gloo";
  options.failure_policy = failure_policy;
  options.shared_memory = shared_memory;
  options.timeout = absl::Seconds(timeout_seconds);
  options.max_recoveries = max_recoveries;
  options.token_file = token_file;
  absl::Status done;
  {
    py::gil_scoped_release unlocked;
    done = RunJob(options, trainer);
  }
  if (!done.ok()) {
    throw std::runtime_error(absl::StrCat("gradsync job: ", done.ToString()));
  }
}

}  // namespace

void RegisterJob(py::module_& m) {
  py::class_<PyRound, std::shared_ptr<PyRound>>(m, "Round")
      .def_property_readonly("number",
                             [](const PyRound& r) { return r.round().number; })
      .def_property_readonly("rank",
                             [](const PyRound& r) { return r.round().rank; })
      .def_property_readonly(
          "world_size", [](const PyRound& r) { return r.round().world_size; })
      .def_property_readonly(
          "local_rank", [](const PyRound& r) { return r.round().local_rank; })
      .def_property_readonly(
          "source_rank", [](const PyRound& r) { return r.round().source_rank; })
      .def_property_readonly("process_group", &PyRound::process_group)
      .def("report_step", &PyRound::Report, py::arg("step"),
           py::arg("samples") = 0, py::arg("loss") = 0.0,
           py::arg("step_seconds") = 0.0,
           py::call_guard<py::gil_scoped_release>())
      .def("reform_requested", &PyRound::ReformRequested,
           py::call_guard<py::gil_scoped_release>());
  py::class_<Trainer, PyTrainer>(m, "Trainer")
      .def(py::init<>())
      .def("committed_step", &Trainer::committed_step)
      .def("has_state", &Trainer::has_state);
  m.def("run_job", &RunJobFromPython, py::arg("trainer"),
        py::arg("coordinator"), py::arg("job"), py::arg("nnodes") = "1",
        py::arg("nproc_per_node") = 1, py::arg("node_id") = "",
        py::arg("failure_policy") = "", py::arg("shared_memory") = true,
        py::arg("timeout_seconds") = 300.0, py::arg("max_recoveries") = 3,
        py::arg("token_file") = "");
}

}  // namespace gradsync
