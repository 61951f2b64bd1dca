#include "worker/runtime/elastic.h"

#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "worker/runtime/reform.h"

namespace gradsync {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// The process group of the round being trained in, so that another thread
// (the heartbeat reporter, told that the round is over) can abort it while
// the training thread is blocked in a collective or in the group's
// bootstrap. The abort runs on a thread of its own: an NCCL abort can take
// seconds, and the reporter must go on heartbeating meanwhile. Thread-safe;
// shared with the reporter's callback, which may outlive the round.
class RoundInTraining {
 public:
  ~RoundInTraining() { Close(); }

  // The backend to abort from now on (nullptr: none, e.g. before it is
  // destroyed; waits for an abort of the previous one in progress). A
  // backend set after an abort was asked for is aborted at once.
  void Set(Backend* backend) {
    absl::MutexLock lock(&mu_);
    backend_ = backend;
    if (backend_ != nullptr && abort_requested_) AbortLocked();
  }

  // Set once an abort was asked for: a shared-memory bootstrap, which has
  // no backend to abort yet, stops waiting (ProcessGroupOptions::cancel).
  const std::atomic<bool>* cancelled() const { return &cancelled_; }

  // Asks for the abort and returns at once.
  void Abort(const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    if (closed_ || abort_requested_) return;
    abort_requested_ = true;
    cancelled_.store(true);
    why_ = why;
    aborter_ = std::thread([this] {
      absl::MutexLock lock(&mu_);
      AbortLocked();
    });
  }

  // No abort after this; waits for one in progress. Called by the training
  // thread once the round is over.
  void Close() {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      backend_ = nullptr;
    }
    if (aborter_.joinable()) aborter_.join();
  }

 private:
  void AbortLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (backend_ == nullptr) return;
    GS_LOG(WARNING) << "the coordinator ended this member (" << why_
                    << "): aborting the " << backend_->name()
                    << " process group";
    backend_->Abort();
  }

  absl::Mutex mu_;
  Backend* backend_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool abort_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
  // Started once, under mu_, by Abort; joined by Close.
  std::thread aborter_;
};

// Joins the next round: with the trainer's state, and as a member of
// `previous` (0: none yet), so that a survivor supersedes it.
absl::StatusOr<v1::Assignment> JoinRound(CoordinatorClient* client,
                                         v1::JoinRequest* request,
                                         int64_t previous,
                                         const RoundTrainer& trainer) {
  request->set_last_round(previous);
  request->set_has_state(trainer.has_state());
  request->set_committed_step(trainer.committed_step());
  const absl::Time start = absl::Now();
  GS_ASSIGN_OR_RETURN(v1::Assignment assignment, client->Join(*request));
  GS_LOG(INFO) << "job '" << assignment.job_id() << "' round "
               << assignment.round() << ": rank " << assignment.rank()
               << " of " << assignment.world_size() << ", resuming after step "
               << assignment.resume_step() << " from rank "
               << assignment.source_rank() << " (joined in "
               << Ms(absl::Now() - start) << " ms)";
  return assignment;
}

// Builds the round's process group and trains in it; `round` can abort the
// process group meanwhile.
absl::Status TrainInRound(CoordinatorClient* client,
                          const v1::Assignment& assignment,
                          const ElasticOptions& options, RoundTrainer* trainer,
                          RoundInTraining* round) {
  const absl::Time start = absl::Now();
  ProcessGroupOptions group = options.process_group;
  group.on_backend = [round](Backend* backend) { round->Set(backend); };
  group.cancel = round->cancelled();
  GS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                      CreateProcessGroup(client, assignment, group));
  const absl::Duration took = absl::Now() - start;
  GS_LOG(INFO) << "round " << assignment.round() << ": " << backend->name()
               << " process group of " << assignment.world_size()
               << " rank(s) ready in " << Ms(took) << " ms";
  round->Set(backend.get());
  absl::Status trained = trainer->TrainRound(assignment, backend.get(), took);
  round->Set(nullptr);
  return trained;
}

// The recoveries one RunElastic call may still make (max_recoveries).
class RecoveryBudget {
 public:
  explicit RecoveryBudget(int max) : max_(max) {}

  bool exhausted() const { return used_ == max_; }
  int used() const { return used_; }
  int max() const { return max_; }

  // Spends one recovery for `why`; FAILED_PRECONDITION naming it when none
  // is left.
  absl::Status Spend(const absl::Status& why) {
    if (exhausted()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gave up after re-forming the round ", used_,
          " time(s) (--max_recoveries); the last failure: ", why.ToString()));
    }
    ++used_;
    return absl::OkStatus();
  }

 private:
  const int max_;
  int used_ = 0;
};

// The assignment of the next round: the launcher's first one, or a join.
absl::StatusOr<v1::Assignment> NextAssignment(
    CoordinatorClient* client, const ElasticOptions& options,
    const RoundTrainer& trainer, int64_t previous,
    std::optional<v1::Assignment>* given, v1::JoinRequest* request) {
  v1::Assignment assignment;
  if (given->has_value()) {
    assignment = **std::move(given);
    given->reset();
  } else {
    GS_ASSIGN_OR_RETURN(assignment,
                        JoinRound(client, request, previous, trainer));
  }
  // The first assignment's local rank is the process's from now on, also
  // when the launcher's request claimed another one it did not get.
  if (options.keep_local_rank && previous == 0) {
    request->set_local_slot(assignment.local_rank());
  }
  return assignment;
}

// A failed agreement to stop for round `previous`'s planned re-form
// (`vote_failed`, reform.h) counts as a recovery unless `assignment`, the
// round it led to, follows only the planned re-form.
absl::Status CountFailedVote(const absl::Status& vote_failed,
                             const v1::Assignment& assignment,
                             int64_t previous, RecoveryBudget* budget) {
  if (vote_failed.ok() || assignment.follows_planned_reform()) {
    return absl::OkStatus();
  }
  GS_RETURN_IF_ERROR(budget->Spend(vote_failed));
  GS_LOG(WARNING) << "round " << previous << " did not end only for its "
                  << "planned re-form (" << vote_failed.message()
                  << "): recovery " << budget->used() << " of at most "
                  << budget->max();
  return absl::OkStatus();
}

// After round `assignment` ended with `trained`: nullopt to rejoin, or what
// RunElastic returns. Sets *vote_failed when this rank's agreement to stop
// for a planned re-form failed (counted at the next assignment).
std::optional<absl::Status> AfterRound(const v1::Assignment& assignment,
                                       const absl::Status& trained,
                                       const RoundTrainer& trainer,
                                       HealthReporter* reporter,
                                       RecoveryBudget* budget,
                                       absl::Status* vote_failed) {
  if (trained.ok()) {
    absl::Status reported = reporter->Finish(true, 0, "");
    if (!absl::IsAborted(reported) || budget->exhausted()) return reported;
    // The round was superseded as training finished (a peer was lost):
    // finish in the next round, which starts at the last step.
    GS_LOG(WARNING) << "round " << assignment.round()
                    << " ended as training finished (" << reported
                    << "); rejoining to finish in the next round";
    budget->Spend(reported).IgnoreError();  // not exhausted
    return std::nullopt;
  }
  if (IsReformAtStepBoundary(trained)) {
    // Planned: nothing failed and nothing is lost, unless the agreement
    // failed (then the next assignment says).
    if (IsReformVoteFailed(trained)) {
      *vote_failed = trained;
      GS_LOG(WARNING) << "round " << assignment.round() << ": "
                      << trained.message() << "; rejoining";
    } else {
      GS_LOG(INFO) << "round " << assignment.round() << ": "
                   << trained.message() << "; rejoining";
    }
    return std::nullopt;
  }
  if (assignment.failure_policy() == v1::FAILURE_POLICY_FAIL ||
      !RecoverableByRejoining(trained)) {
    return trained;
  }
  absl::Status spent = budget->Spend(trained);
  if (!spent.ok()) return spent;
  GS_LOG(WARNING) << "round " << assignment.round() << " failed on rank "
                  << assignment.rank() << " after step "
                  << trainer.committed_step() << ": " << trained
                  << "; rejoining to re-form it (recovery " << budget->used()
                  << " of at most " << budget->max() << ")";
  return std::nullopt;
}

}  // namespace

bool RecoverableByRejoining(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsAborted(status) || absl::IsCancelled(status);
}

absl::Status RunElastic(CoordinatorClient* client, v1::JoinRequest request,
                        const ElasticOptions& options,
                        HealthReporter* reporter, RoundTrainer* trainer) {
  int64_t previous = 0;
  RecoveryBudget budget(options.max_recoveries);
  absl::Status vote_failed;  // of the last round's planned re-form
  std::optional<v1::Assignment> given = options.first_assignment;
  for (;;) {
    GS_ASSIGN_OR_RETURN(v1::Assignment assignment,
                        NextAssignment(client, options, *trainer, previous,
                                       &given, &request));
    auto round = std::make_shared<RoundInTraining>();
    reporter->Start(assignment, request.node().incarnation_id(),
                    [round](const absl::Status& why) { round->Abort(why); });
    // After Start: a refusal ends RunElastic as a member of this round, so
    // that its report (RunJob's) reaches the round the job is in.
    absl::Status taken = options.on_assignment
                             ? options.on_assignment(assignment)
                             : absl::OkStatus();
    if (taken.ok()) {
      taken = CountFailedVote(std::exchange(vote_failed, absl::OkStatus()),
                              assignment, previous, &budget);
    }
    if (!taken.ok()) {
      round->Close();
      return taken;
    }
    absl::Status trained =
        TrainInRound(client, assignment, options, trainer, round.get());
    round->Close();
    previous = assignment.round();
    std::optional<absl::Status> done = AfterRound(
        assignment, trained, *trainer, reporter, &budget, &vote_failed);
    if (done.has_value()) return *done;
  }
}

}  // namespace gradsync
