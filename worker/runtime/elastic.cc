#include "worker/runtime/elastic.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

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

// Builds the round's process group and trains in it.
absl::Status TrainInRound(CoordinatorClient* client,
                          const v1::Assignment& assignment,
                          const ElasticOptions& options,
                          RoundTrainer* trainer) {
  const absl::Time start = absl::Now();
  GS_ASSIGN_OR_RETURN(
      std::unique_ptr<Backend> backend,
      CreateProcessGroup(client, assignment, options.process_group));
  GS_LOG(INFO) << "round " << assignment.round() << ": " << backend->name()
               << " process group of " << assignment.world_size()
               << " rank(s) ready in " << Ms(absl::Now() - start) << " ms";
  return trainer->TrainRound(assignment, backend.get());
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
  for (int recoveries = 0;; ++recoveries) {
    GS_ASSIGN_OR_RETURN(v1::Assignment assignment,
                        JoinRound(client, &request, previous, *trainer));
    if (options.on_assignment) options.on_assignment(assignment);
    reporter->Start(assignment, request.node().incarnation_id());
    absl::Status trained = TrainInRound(client, assignment, options, trainer);
    if (trained.ok()) return trained;
    if (assignment.failure_policy() == v1::FAILURE_POLICY_FAIL ||
        !RecoverableByRejoining(trained)) {
      return trained;
    }
    if (recoveries == options.max_recoveries) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gave up after re-forming the round ", recoveries,
          " time(s) (--max_recoveries); the last failure: ",
          trained.ToString()));
    }
    GS_LOG(WARNING) << "round " << assignment.round() << " failed on rank "
                    << assignment.rank() << " after step "
                    << trainer->committed_step() << ": " << trained
                    << "; rejoining to re-form it (recovery "
                    << recoveries + 1 << " of at most "
                    << options.max_recoveries << ")";
    previous = assignment.round();
  }
}

}  // namespace gradsync
