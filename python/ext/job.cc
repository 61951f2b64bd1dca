#include "python/ext/job.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/failpoint.h"
#include "worker/backend/nccl_faults.h"
#include "worker/ddp/tensor_digest.h"
#include "worker/launch/process_stacks.h"
#include "worker/runtime/reform.h"
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
  // One committed step's report: with an exact global batch, the
  // micro-batches this rank ran of the step's `micro_batches_per_step` and
  // what one took (zeros otherwise); when its first gradient bucket was
  // ready (Unix seconds; 0: not observed) and its exposed communication
  // (gradsync.elastic.observe's DDP hook); `checkpoint`: rank 0 writes a
  // checkpoint after this step, which the others wait for in their next
  // collective (no self-set collective timeout until the next step).
  // std::invalid_argument (ValueError) for what CheckStepReport refuses,
  // which changes nothing; std::runtime_error once the coordinator failed
  // the job.
  void Report(int64_t step, int64_t samples, double loss, double step_seconds,
              int micro_batches, int micro_batches_per_step,
              double micro_batch_seconds, double first_bucket_ready,
              double communication_seconds, bool checkpoint) const {
    StepReport report;
    report.step = step;
    report.checkpoint = checkpoint;
    report.loss = loss;
    report.step_time = absl::Seconds(step_seconds);
    report.micro_batches = micro_batches;
    report.micro_batches_per_step = micro_batches_per_step;
    report.micro_batch_time = absl::Seconds(micro_batch_seconds);
    if (first_bucket_ready > 0) {
      report.ddp.first_bucket_ready = absl::FromUnixNanos(
          static_cast<int64_t>(first_bucket_ready * 1e9));
    }
    report.ddp.exposed_communication = absl::Seconds(communication_seconds);
    absl::Status reported = round().report_step(report, samples);
    if (absl::IsInvalidArgument(reported)) {  // refused, nothing changed
      throw std::invalid_argument(
          absl::StrCat("gradsync: ", reported.message()));
    }
    if (!reported.ok()) {
      throw std::runtime_error(absl::StrCat("gradsync: ", reported.ToString()));
    }
  }
  // The fingerprint of the replica whose tensors are `tensors` (named
  // `names`) as committed step `step` left them (gradsync.elastic takes the
  // model's parameters and the optimizer's state).
  void ReportFingerprint(int64_t step, std::vector<std::string> names,
                         const std::vector<at::Tensor>& tensors) const {
    if (step < 1) {
      throw std::invalid_argument(absl::StrCat(
          "gradsync: a fingerprint's step is a committed step (1 or more), "
          "not ", step));
    }
    absl::StatusOr<ReplicaDigest> digest =
        DigestTensors(std::move(names), tensors);
    if (absl::IsInvalidArgument(digest.status())) {
      throw std::invalid_argument(
          absl::StrCat("gradsync: ", digest.status().message()));
    }
    if (!digest.ok()) {
      throw std::runtime_error(absl::StrCat("gradsync: ", digest.status().ToString()));
    }
    round().report_fingerprint(step, *digest);
  }
  bool ReformRequested() const {
    return round().reform_requested ? round().reform_requested() : false;
  }
  bool MayReform() const { return static_cast<bool>(round().reform_requested); }
  void End() { round_ = nullptr; }

 private:
  const Round* round_;
  const c10::intrusive_ptr<TorchProcessGroup> group_;
};

// "TypeName: message" of a Python exception (without its traceback: it is
// printed on the process's stderr, and the job's reason stays one line).
std::string ExceptionText(const py::error_already_set& e) {
  return absl::StrCat(
      py::str(e.type().attr("__name__")).cast<std::string>(), ": ",
      py::str(e.value()).cast<std::string>());
}

// ExceptionText, or pybind11's text of `e` when that cannot be made (its
// __str__ raised).
std::string TextOf(const py::error_already_set& e) {
  try {
    return ExceptionText(e);
  } catch (const std::exception&) {
    return e.what();
  }
}

// The Python exception a loop raises to end its round at a step boundary,
// every rank after the same committed step, because the coordinator asked
// (gradsync.elastic.ReformAtStepBoundary).
PyObject* reform_exception = nullptr;

// Its subclass for a rank that was asked and whose agreement to stop
// failed (gradsync.elastic.should_reform): a peer that agreed may have
// rejoined first, or died (reform.h's ReformVoteFailed).
PyObject* vote_failed_exception = nullptr;

// A gradsync.elastic.Trainer: C++ calls its Python methods.
class PyTrainer : public Trainer {
 public:
  using Trainer::Trainer;

  // Calls the Python train(round) over a torch process group of the round's
  // backend. A Python exception becomes: for ReformAtStepBoundary, the
  // planned re-form after the committed step (rejoined at once, no
  // recovery counted); for ReformVoteFailed, the same unless the next
  // round says the old one did not end as planned (a recovery then);
  // otherwise the status of the collective that failed
  // first (a recoverable one re-forms the round) or, when none did,
  // INTERNAL with the exception's text (the job fails).
  //
  // Once train() returned or raised, the loop's committed_step() and
  // has_state() are read again (ReadProgress) for a rejoin; one of them
  // raising fails the job, naming it (and train()'s exception).
  absl::Status Train(const Round& round) override {
    auto group = c10::make_intrusive<TorchProcessGroup>(round.backend);
    group_ = group;
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
          // gradsync.elastic.Trainer's: what follows the last step (its
          // replica's fingerprint).
          py::function returned = py::get_override(this, "_train_returned");
          if (returned) returned(py_round);
          // A round that ends after training can still be superseded (a
          // peer lost before the completion): the rejoin sends this.
          const absl::Status progress = ReadProgress();
          if (!progress.ok()) {
            trained = absl::InternalError(absl::StrCat(
                "train(round) returned; then ", progress.message()));
          }
        }
      } catch (py::error_already_set& e) {
        trained = Raised(e, *group);
      }
      py_round->End();
    }
    return trained;
  }

  // Reads the loop's committed_step() and has_state() (the latter's
  // default: a step committed) into what RunJob's committed_step() and
  // has_state() return until the next read: RunJob asks for them between
  // rounds, where a Python exception could only unwind it. Throws what the
  // methods raise (py::error_already_set), py::cast_error for a result of
  // the wrong type, with `reading` naming the method; keeps the values read
  // before then. Takes the GIL.
  void ReadProgressOrThrow(const char** reading) {
    py::gil_scoped_acquire gil;
    *reading = "committed_step()";
    py::function committed = py::get_override(this, "committed_step");
    if (!committed) {
      throw std::invalid_argument(
          "gradsync.elastic.Trainer subclasses must define committed_step()");
    }
    const auto step = committed().cast<int64_t>();
    *reading = "has_state()";
    py::function has = py::get_override(this, "has_state");
    const bool state = has ? has().cast<bool>() : step > 0;
    committed_step_ = step;
    has_state_ = state;
  }

  // Ends the round's group (aborting its collectives still pending) once
  // RunJob reported what Train returned.
  void RoundEnded() override {
    if (group_) group_->End();
    group_.reset();
  }

  // As the last ReadProgress read them.
  int64_t committed_step() const override { return committed_step_; }
  bool has_state() const override { return has_state_; }

 private:
  // ReadProgressOrThrow, with what it throws as INTERNAL naming the method.
  absl::Status ReadProgress() {
    const char* reading = "";
    try {
      ReadProgressOrThrow(&reading);
      return absl::OkStatus();
    } catch (py::error_already_set& e) {
      return absl::InternalError(absl::StrCat(reading, " raised ", TextOf(e)));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(reading, ": ", e.what()));
    }
  }

  // What train() raising `e` means (see Train). Never throws: a Python
  // error while taking it in (committed_step() or has_state() raising, an
  // exception whose text cannot be made) is INTERNAL, naming both.
  absl::Status Raised(py::error_already_set& e,
                      const TorchProcessGroup& group) {
    const absl::Status collective = group.first_failure();
    try {
      const bool reform = e.matches(reform_exception);
      if (!reform) {
        py::module_::import("traceback")
            .attr("print_exception")(e.type(), e.value(), e.trace());
      }
      const absl::Status progress = ReadProgress();
      if (!progress.ok()) {
        return absl::InternalError(absl::StrCat("the training loop raised ",
                                                TextOf(e), "; then ",
                                                progress.message()));
      }
      if (e.matches(vote_failed_exception)) {
        return ReformVoteFailed(
            committed_step(),
            collective.ok() ? absl::AbortedError(TextOf(e)) : collective);
      }
      if (reform) return ReformAtStepBoundary(committed_step());
      if (!collective.ok()) return collective;
      return absl::InternalError(
          absl::StrCat("the training loop raised ", TextOf(e)));
    } catch (py::error_already_set& then) {
      return absl::InternalError(absl::StrCat(
          "the training loop raised ", TextOf(e), "; then ", TextOf(then)));
    } catch (const std::exception& then) {
      return absl::InternalError(absl::StrCat(
          "the training loop raised ", TextOf(e), "; then ", then.what()));
    }
  }

  // The process group of the round Train ran last, until RoundEnded.
  c10::intrusive_ptr<TorchProcessGroup> group_;
  // What ReadProgress read last. Atomic: read by RunJob's thread, written
  // by the thread that runs Train (the same one today).
  std::atomic<int64_t> committed_step_{0};
  std::atomic<bool> has_state_{false};
};

// Arms `spec` (comma-separated NAME or NAME:N) for this process's NCCL
// collectives: only the failpoints that inject into them apply to a Python
// loop, and only on a GPU or a simulated one. std::invalid_argument,
// arming nothing, otherwise.
CommFaultPlan ArmNcclFailpoints(const std::string& spec, v1::DeviceType device) {
  if (spec.empty()) return nullptr;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    const absl::string_view name = item.substr(0, item.find(':'));
    if (name != kFailpointNcclAsyncError && name != kFailpointNcclHang) {
      throw std::invalid_argument(absl::StrCat(
          "failpoint '", name, "' does not apply to a Python training loop "
          "(it takes ", kFailpointNcclAsyncError, " and ", kFailpointNcclHang,
          ")"));
    }
  }
  if (device != v1::DEVICE_TYPE_CUDA && device != v1::DEVICE_TYPE_SIM) {
    throw std::invalid_argument(
        "the NCCL failpoints inject into NCCL collectives: they need "
        "device='cuda' or device='sim'");
  }
  const absl::Status armed = ArmFailpoint(spec);
  if (!armed.ok()) throw std::invalid_argument(armed.ToString());
  return FailpointCommFaults();
}

// run_job(trainer, **options): RunJob with the GIL released.
void RunJobFromPython(
    Trainer* trainer, const std::string& coordinator, const std::string& job,
    const std::string& nnodes, int nproc_per_node, const std::string& node_id,
    const std::string& failure_policy, bool shared_memory,
    double timeout_seconds, int max_recoveries, double last_call_seconds,
    const std::string& token_file, const std::string& device,
    const std::string& failpoint, const std::string& divergence_policy,
    bool exact_global_batch, const std::string& straggler_policy,
    double straggler_threshold_seconds, const std::string& stacks_file,
    double collective_timeout_factor, double min_collective_timeout_seconds) {
  if (!(collective_timeout_factor >= 0) ||
      !(min_collective_timeout_seconds > 0)) {
    throw std::invalid_argument(absl::StrCat(
        "collective_timeout_factor must be 0 (off) or more and "
        "min_collective_timeout a positive number of seconds, not ",
        collective_timeout_factor, " and ", min_collective_timeout_seconds));
  }
  if (straggler_threshold_seconds < 0) {
    throw std::invalid_argument(absl::StrCat(
        "straggler_threshold must be 0 (the coordinator's) or more seconds, "
        "not ", straggler_threshold_seconds));
  }
  JobOptions options;
  options.coordinator = coordinator;
  options.job = job;
  options.nnodes = nnodes;
  options.nproc_per_node = nproc_per_node;
  options.node_id = node_id;
  if (device == "cpu") {
    options.device = v1::DEVICE_TYPE_CPU;
  } else if (device == "cuda") {
    // A GPU of this host, picked once from the launcher's local rank or
    // the first assignment and kept (NCCL; the process group takes CUDA
    // tensors on it).
    options.device = v1::DEVICE_TYPE_CUDA;
  } else if (device == "sim") {
    // A simulated GPU: host memory through the NCCL backend's code paths,
    // its abort and re-create included (worker/backend/sim_device.h).
    options.device = v1::DEVICE_TYPE_SIM;
  } else {
    throw std::invalid_argument(absl::StrCat(
        "device must be 'cpu', 'cuda' or 'sim', not '", device, "'"));
  }
  options.nccl_faults = ArmNcclFailpoints(failpoint, options.device);
  options.failure_policy = failure_policy;
  options.divergence_policy = divergence_policy;
  options.exact_global_batch = exact_global_batch;
  options.straggler_policy = straggler_policy;
  options.straggler_threshold = absl::Seconds(straggler_threshold_seconds);
  if (!stacks_file.empty()) {
    // The loop's Python threads, which faulthandler dumps into the file
    // (gradsync.elastic registers it on PythonStacksSignal()).
    options.capture_stacks = [stacks_file](int64_t request) {
      return CaptureProcessStacks(request, getpid(), stacks_file,
                                  absl::Seconds(2), PythonStacksSignal());
    };
  }
  options.shared_memory = shared_memory;
  options.timeout = absl::Seconds(timeout_seconds);
  options.collective_timeout_factor = collective_timeout_factor;
  options.min_collective_timeout =
      absl::Seconds(min_collective_timeout_seconds);
  options.max_recoveries = max_recoveries;
  options.last_call_timeout = absl::Seconds(last_call_seconds);
  options.token_file = token_file;
  // The progress the first join sends; an exception here is the caller's.
  auto* py_trainer = dynamic_cast<PyTrainer*>(trainer);
  if (py_trainer == nullptr) {
    throw std::invalid_argument(
        "run_job takes a gradsync.elastic.Trainer subclass");
  }
  const char* reading = "";
  py_trainer->ReadProgressOrThrow(&reading);
  absl::Status done;
  {
    py::gil_scoped_release unlocked;
    done = RunJob(options, trainer);
  }
  if (!done.ok()) {
    throw std::runtime_error(absl::StrCat("gradsync job: ", done.ToString()));
  }
}

void RegisterRound(py::module_& m) {
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
          "backend", [](const PyRound& r) { return r.round().backend_name; })
      .def_property_readonly(
          "device", [](const PyRound& r) { return r.round().device_name; })
      .def_property_readonly(
          "source_rank", [](const PyRound& r) { return r.round().source_rank; })
      .def_property_readonly(
          "micro_batch_shares",
          [](const PyRound& r) { return r.round().micro_batch_shares; })
      .def_property_readonly("process_group", &PyRound::process_group)
      // gradsync.elastic wraps it (Round.report_step), with the defaults.
      .def("report_step", &PyRound::Report, py::arg("step"), py::arg("samples"),
           py::arg("loss"), py::arg("step_seconds"), py::arg("micro_batches"),
           py::arg("micro_batches_per_step"), py::arg("micro_batch_seconds"),
           py::arg("first_bucket_ready"), py::arg("communication_seconds"),
           py::arg("checkpoint"), py::call_guard<py::gil_scoped_release>())
      .def("report_fingerprint", &PyRound::ReportFingerprint, py::arg("step"),
           py::arg("names"), py::arg("tensors"),
           py::call_guard<py::gil_scoped_release>())
      .def("reform_requested", &PyRound::ReformRequested,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("may_reform", &PyRound::MayReform);
  static py::exception<std::runtime_error> reform(m, "ReformAtStepBoundary");
  reform_exception = reform.ptr();
  static py::exception<std::runtime_error> vote_failed(m, "ReformVoteFailed",
                                                       reform.ptr());
  vote_failed_exception = vote_failed.ptr();
}

}  // namespace

void RegisterJob(py::module_& m) {
  RegisterRound(m);
  py::class_<Trainer, PyTrainer>(m, "Trainer").def(py::init<>());
  m.def(
      "run_job", &RunJobFromPython, py::arg("trainer"), py::arg("coordinator"),
      py::arg("job"), py::arg("nnodes") = "1", py::arg("nproc_per_node") = 1,
      py::arg("node_id") = "", py::arg("failure_policy") = "",
      py::arg("shared_memory") = true, py::arg("timeout_seconds") = 300.0,
      py::arg("max_recoveries") = 3, py::arg("last_call_seconds") = 30.0,
      py::arg("token_file") = "", py::arg("device") = "cpu",
      py::arg("failpoint") = "", py::arg("divergence_policy") = "",
      py::arg("exact_global_batch") = false, py::arg("straggler_policy") = "",
      py::arg("straggler_threshold_seconds") = 0.0, py::arg("stacks_file") = "",
      py::arg("collective_timeout_factor") = 10.0,
      py::arg("min_collective_timeout_seconds") = 10.0);
  m.def("python_stacks_signal", &PythonStacksSignal,
        "The signal gradsync.elastic registers faulthandler on, for the "
        "Python stacks of a hang diagnosis.");
}

}  // namespace gradsync
