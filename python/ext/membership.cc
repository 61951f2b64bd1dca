#include "python/ext/membership.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "worker/client/grpc_coordinator_client.h"
#include "worker/runtime/health_reporter.h"
#include "worker/runtime/join.h"

namespace py = pybind11;

namespace gradsync {
namespace {

[[noreturn]] void Raise(const absl::Status& status, const char* what) {
  throw std::runtime_error(absl::StrCat("gradsync ", what, ": ", status.ToString()));
}

// What the membership's completion needs, shared by the Python object and
// the exit handler (which may run after Python let go of the object).
struct MemberState {
  // The process that joined: a child forked from it (that exits with
  // exit(), not os._exit) must not report its status as the member's.
  pid_t pid = getpid();
  std::unique_ptr<CoordinatorClient> client;
  std::unique_ptr<HealthReporter> reporter;
  absl::Mutex mu;
  bool finished ABSL_GUARDED_BY(mu) = false;
  // What a failure says: the exception that ended the main thread, or the
  // string given to sys.exit.
  std::string failure_message ABSL_GUARDED_BY(mu);

  // Reports the completion once; later calls do nothing.
  absl::Status Finish(bool success, int exit_code, std::string message) {
    {
      absl::MutexLock lock(&mu);
      if (finished) return absl::OkStatus();
      finished = true;
      if (message.empty() && !success) message = failure_message;
    }
    if (message.empty() && !success) {
      message = absl::StrCat("exited with code ", exit_code);
    }
    return reporter->Finish(success, exit_code, message);
  }
};

// glibc's on_exit handler: the process's exit status is the completion
// (exit(N) and sys.exit(N) and raise SystemExit(N) alike; an uncaught
// exception exits 1). Runs after Python finalized; the state it holds was
// leaked on purpose for it.
void ReportExit(int status, void* arg) {
  auto* state = static_cast<std::shared_ptr<MemberState>*>(arg);
  if (getpid() != (*state)->pid) return;
  const absl::Status finished = (*state)->Finish(status == 0, status, "");
  if (!finished.ok()) {
    std::fprintf(stderr, "gradsync: could not report the completion: %s\n",
                 finished.ToString().c_str());
  }
}

// One process's membership of a job: joined at construction (the GIL
// released while it waits for its round), heartbeating from the
// reporter's thread (reconnecting with backoff when a stream breaks) until
// the process exits, whose exit status it reports (or Finish). Thread-safe.
class Membership {
 public:
  Membership(const std::string& coordinator, const std::string& job,
             const std::string& nnodes, int nproc_per_node,
             const std::string& node_id, double join_timeout_seconds,
             const std::string& token, const std::string& tls_ca,
             const std::string& tls_cert, const std::string& tls_key)
      : state_(std::make_shared<MemberState>()) {
    ClientOptions options;
    options.target = coordinator;
    options.token = token;
    options.tls = {tls_ca, tls_cert, tls_key};
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
        GrpcCoordinatorClient::Create(options);
    if (!client.ok()) Raise(client.status(), "client");
    state_->client = *std::move(client);
    JoinConfig join;
    join.job_id = job;
    join.nnodes = nnodes;
    join.nproc_per_node = nproc_per_node;
    join.node_id = node_id;
    join.join_timeout = absl::Seconds(join_timeout_seconds);
    join.address = DefaultWorkerAddress(coordinator);
    absl::StatusOr<v1::JoinRequest> request = BuildJoinRequest(join);
    if (!request.ok()) Raise(request.status(), "join");
    request_ = *std::move(request);
    assignment_ = JoinNow();
    state_->reporter = std::make_unique<HealthReporter>(state_->client.get());
    StartReporting();
    on_exit(&ReportExit, new std::shared_ptr<MemberState>(state_));
  }

  // The serialized gradsync.v1.Assignment of the round it joined.
  py::bytes assignment() const { return assignment_.SerializeAsString(); }

  // Joins the job's next round as a member of the one it is in (a process
  // group made again): the round is superseded, as by a survivor's rejoin,
  // and the heartbeats move to the new one. With the first join's settings
  // (a job's config is fixed); `timeout_seconds` > 0 bounds the wait for
  // the new round (the join is then withdrawn and RuntimeError names the
  // timeout), 0 leaves it to the job's join timeout. Called from one
  // thread.
  void Rejoin(double timeout_seconds) {
    if (getpid() != state_->pid) {
      throw std::runtime_error(
          "gradsync join: a process forked from a member is not that member");
    }
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->finished) {
        throw std::runtime_error(
            "gradsync join: this process reported its completion already");
      }
    }
    request_.set_last_round(assignment_.round());
    assignment_ = JoinNow(timeout_seconds > 0 ? absl::Seconds(timeout_seconds)
                                              : absl::ZeroDuration());
    StartReporting();
  }

  // Makes a serialized gradsync.v1.WorkerMetrics this member's latest (its
  // events queued for the next heartbeat).
  void Report(const std::string& serialized) {
    v1::WorkerMetrics metrics;
    if (!metrics.ParseFromString(serialized)) {
      throw std::invalid_argument("report: not a gradsync.v1.WorkerMetrics");
    }
    state_->reporter->Update(metrics);
  }

  // What a failing exit reports as its message (the exception that ended
  // the main thread, or sys.exit's string).
  void SetFailureMessage(const std::string& message) {
    absl::MutexLock lock(&state_->mu);
    state_->failure_message = message;
  }

  // Stops heartbeating and reports the completion now (once; the exit
  // then reports nothing).
  void Finish(bool success, int exit_code, const std::string& message) {
    const absl::Status finished = state_->Finish(success, exit_code, message);
    if (!finished.ok()) Raise(finished, "completion");
  }

 private:
  // Heartbeats for assignment_'s round, from a training state of its own
  // (Start drops the counters of the round before).
  void StartReporting() {
    state_->reporter->Start(assignment_, request_.node().incarnation_id());
    v1::WorkerMetrics training;
    training.set_state(v1::WORKER_STATE_TRAINING);
    state_->reporter->Update(training);
  }

  // Sends request_ (the GIL released while it waits for the round), waiting
  // at most `max_wait` (zero: the join timeout of request_'s config); a
  // join that ran out of it is withdrawn.
  v1::Assignment JoinNow(absl::Duration max_wait = absl::ZeroDuration()) {
    absl::StatusOr<v1::Assignment> assignment;
    {
      py::gil_scoped_release unlocked;
      assignment = state_->client->Join(request_, max_wait);
      if (absl::IsDeadlineExceeded(assignment.status()) &&
          max_wait > absl::ZeroDuration()) {
        state_->client
            ->Leave(request_.job_id(), request_.node().incarnation_id())
            .IgnoreError();
        assignment = absl::DeadlineExceededError(
            absl::StrCat("timeout: no round formed within ",
                         absl::FormatDuration(max_wait)));
      }
    }
    if (!assignment.ok()) Raise(assignment.status(), "join");
    return *std::move(assignment);
  }

  std::shared_ptr<MemberState> state_;
  v1::JoinRequest request_;
  v1::Assignment assignment_;
};

}  // namespace

void RegisterMembership(py::module_& m) {
  py::class_<Membership>(m, "Membership")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    int, const std::string&, double, const std::string&,
                    const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("coordinator"), py::arg("job"), py::arg("nnodes"),
           py::arg("nproc_per_node"), py::arg("node_id"),
           py::arg("join_timeout"), py::arg("token") = "",
           py::arg("tls_ca") = "", py::arg("tls_cert") = "",
           py::arg("tls_key") = "")
      .def_property_readonly("assignment", &Membership::assignment)
      .def("rejoin", &Membership::Rejoin, py::arg("timeout_seconds") = 0.0)
      .def("report", &Membership::Report, py::arg("metrics"))
      .def("set_failure_message", &Membership::SetFailureMessage,
           py::arg("message"))
      .def("finish", &Membership::Finish, py::arg("success"),
           py::arg("exit_code"), py::arg("message"),
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace gradsync
