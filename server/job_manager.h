// The job registry: which jobs exist, their config, lifecycle state and the
// membership of their latest round. The rendezvous manager drives the state
// transitions; the Jobs service reads from here.
#ifndef GRADSYNC_SERVER_JOB_MANAGER_H_
#define GRADSYNC_SERVER_JOB_MANAGER_H_

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "proto/gradsync/v1/job.pb.h"
#include "server/storage/storage.h"

namespace gradsync {

// A change failure detection (HealthManager) makes to a running round.
struct HealthUpdate {
  struct MemberChange {
    int rank = 0;
    v1::MemberState state = v1::MEMBER_STATE_UNSPECIFIED;
    std::string reason;  // Member.state_reason
  };
  std::vector<MemberChange> members;
  // The job's new state; UNSPECIFIED keeps it.
  v1::JobState job_state = v1::JOB_STATE_UNSPECIFIED;
  // JobStatus.reason with the new state.
  std::string reason;
};

// Where a job is in its life, without its members: cheap to read often.
struct JobPhase {
  int64_t round = 0;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
};

// Who the members of a job's latest round are, by rank.
struct RoundMembers {
  v1::JobConfig config;
  JobPhase phase;
  std::vector<std::string> incarnations;
  std::vector<std::string> hosts;
  // As recorded: ACTIVE, LOST, or EXITED (in a job that has not ended, an
  // EXITED member succeeded).
  std::vector<v1::MemberState> states;
};

// Upper bounds (seconds) of the recovery phase histograms' buckets.
inline constexpr std::array<double, 12> kRecoveryBuckets = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

// Observations of one recovery phase, for a Prometheus histogram.
struct PhaseHistogram {
  std::array<int64_t, kRecoveryBuckets.size() + 1> counts{};  // not cumulative
  double sum = 0;  // seconds
  int64_t count = 0;
  void Observe(absl::Duration d);
};

// Counts over every job, for metrics.
struct JobCensus {
  std::map<v1::JobState, int64_t> jobs;        // jobs by state
  std::map<v1::MemberState, int64_t> members;  // latest rounds' members
  // (job id, rounds closed so far), by job id.
  std::vector<std::pair<std::string, int64_t>> rounds;
  // (job id, recoveries so far), by job id.
  std::vector<std::pair<std::string, int64_t>> recoveries;
  // Phase -> its durations over every recovery since the coordinator
  // started: "detection" and "rendezvous" once per recovery;
  // "process_group", "state_transfer" and "first_step" once per member of a
  // recovered round.
  std::map<std::string, PhaseHistogram> recovery_phases;
};

// Whether `state` is final (SUCCEEDED or FAILED).
bool IsTerminal(v1::JobState state);

// What JobManager refuses to hold: past them, creating a job is
// RESOURCE_EXHAUSTED naming the limit and its coordinator flag.
struct JobLimits {
  // Jobs held, ended ones included until forgotten (--retention).
  int64_t max_jobs = 10000;  // --max_jobs
  // Processes a job may have: max_nodes x nproc_per_node.
  int64_t max_world_size = 1000000;  // --max_world_size
  // Whether a join may create its job (GetOrCreate); otherwise jobs are
  // made only by Create (`gradsync create`). --create_jobs_on_join.
  bool create_on_join = true;
};

// Owns the record (v1::JobStatus) of every job and writes each change through
// to Storage under "jobs/<job_id>", in parts (server/job_records.h): a change
// to a few members writes those members' changes, not the job. Thread-safe:
// each job has its own lock, held across the writes of its record, so a job
// never waits for another job's commits (making a job and forgetting one
// hold the lock of the map of jobs across theirs). Never calls into another
// manager, so any manager may call it while holding its own lock. `storage`
// and `clock` must outlive it.
class JobManager {
 public:
  JobManager(Storage* storage, Clock* clock, JobLimits limits = JobLimits());

  // Loads the records already in storage (for a durable backend); call once
  // before serving.
  absl::Status LoadFromStorage();

  // Creates a job in state WAITING. INVALID_ARGUMENT for a bad config,
  // ALREADY_EXISTS when the id is taken, RESOURCE_EXHAUSTED past a limit
  // (JobLimits).
  absl::StatusOr<v1::JobStatus> Create(const v1::JobConfig& config);

  // Returns the normalized config of `job_id`. When the job does not exist
  // and `config` is given, creates it; without a config that is NOT_FOUND.
  // When it exists and `config` is given, the two must match (else
  // FAILED_PRECONDITION naming the job's config).
  absl::StatusOr<v1::JobConfig> GetOrCreate(absl::string_view job_id,
                                            const v1::JobConfig* config);

  // One job's record; NOT_FOUND for an unknown id.
  absl::StatusOr<v1::JobStatus> Get(absl::string_view job_id) const;
  // The same, copied into `out` (which may live on an arena).
  absl::Status CopyTo(absl::string_view job_id, v1::JobStatus* out) const;
  // The same with only some of the members: those of ranks in
  // [rank_from, rank_to) that `keep` accepts, in rank order, at most `limit`
  // of them. Returns what the selection found over every member. `keep`
  // runs under this manager's lock, after everything but the members was
  // copied into `out`.
  struct MemberSelection {
    int rank_from = 0;
    int rank_to = 0;  // exclusive; 0: through the last
    std::function<bool(const v1::Member&)> keep;  // null: every member
    int limit = 0;                                // 0: no limit
    // Members before this rank are counted but not copied (a later page).
    int page_start = 0;
  };
  struct SelectionCounts {
    int active = 0, lost = 0, exited = 0;  // over every member
    int matching = 0;  // selected, over all pages
    int next_rank = -1;  // where the next page starts; -1 after the last
  };
  absl::StatusOr<SelectionCounts> CopySelected(
      absl::string_view job_id, const MemberSelection& selection,
      v1::JobStatus* out) const;

  // Whether `job_id` exists.
  bool Exists(absl::string_view job_id) const;

  // Jobs and members by state, and each job's round count.
  JobCensus Census() const;

  // Every job's record, ordered by id, without the members lists.
  std::vector<v1::JobStatus> List() const;

  // Records that `round` closed with `members` (rank order): state RUNNING.
  // With `recovery` (the round replaced one that failed), appends it to the
  // job's recoveries and counts its phases.
  absl::Status RecordRoundClosed(absl::string_view job_id, int64_t round,
                                 v1::Backend backend,
                                 std::vector<v1::Member> members,
                                 const v1::Recovery* recovery = nullptr);

  // Records that the running round ended before the job finished (a member
  // rejoined or was lost): state back to WAITING with `reason`, members
  // shown as they were.
  absl::Status RecordRoundSuperseded(absl::string_view job_id,
                                     absl::string_view reason);

  // A member of `round` reported how its start went: folded into the job's
  // recovery that formed `round` (the slowest member's of each phase), and
  // counted in the phase histograms. A no-op when no recovery formed
  // `round`. NOT_FOUND for an unknown job. In memory only, at once (it runs
  // on the heartbeat path): the record is stored by the next
  // SaveRoundStarts, or by any other change of it, so that a round of N
  // members costs a few writes instead of N. A crash may lose the reports
  // since the last save: timings, not the job's state.
  absl::Status RecordRoundStart(absl::string_view job_id, int64_t round,
                                const v1::RoundStartTimings& timings);

  // Stores the records that RecordRoundStart changed since they were last
  // stored, one write per job (the coordinator calls it every poll and as
  // it stops). The first error; a record it could not store is tried again
  // at the next call.
  absl::Status SaveRoundStarts();

  // The job's round, state and reason; NOT_FOUND for an unknown id.
  absl::StatusOr<JobPhase> GetPhase(absl::string_view job_id) const;

  // The config, phase and members (by rank) of the job's latest round.
  absl::StatusOr<RoundMembers> GetRoundMembers(absl::string_view job_id) const;

  // Applies `update` to round `round` of the job. FAILED_PRECONDITION (and
  // no change) unless `round` is the job's latest and it is running (RUNNING
  // or DEGRADED). A terminal job state sets end_time.
  absl::Status RecordHealth(absl::string_view job_id, int64_t round,
                            const HealthUpdate& update);

  // Applies `update`'s member changes to round `round` of a job that ended
  // in it: what was learnt of a member after the end (one taken for stopped
  // by the job's failure whose heartbeat stream then broke had been lost).
  // The job's state, reason and end time stay; `update.job_state` must be
  // UNSPECIFIED. FAILED_PRECONDITION (and no change) unless `round` is the
  // job's latest and the job ended.
  absl::Status RecordAfterEnd(absl::string_view job_id, int64_t round,
                              const HealthUpdate& update);

  // The ids of the jobs that ended (SUCCEEDED or FAILED) before `cutoff`.
  std::vector<std::string> EndedBefore(absl::Time cutoff) const;

  // Removes the job if it ended before `cutoff`; whether it did. Forget a
  // job here after every other manager forgot it: until then it stays
  // ended, which refuses joins, so no manager can start its id afresh
  // while another still holds the old job (and NOT_FOUND from Get() means
  // every manager forgot it).
  bool ForgetIfEndedBefore(absl::string_view job_id, absl::Time cutoff);

 private:
  // One job's record, and the seq of its next change record in its round.
  struct Job {
    absl::Mutex mu;
    v1::JobStatus record ABSL_GUARDED_BY(mu);
    int64_t next_change ABSL_GUARDED_BY(mu) = 0;
    // The record holds round-start reports that storage does not yet.
    bool unsaved_round_starts ABSL_GUARDED_BY(mu) = false;
  };

  // Applies `change` to the stored record (without its members), then, once
  // stored, to the job's record (with the round-start reports it held:
  // they are stored then too).
  absl::Status UpdateLocked(Job* job,
                            const std::function<void(v1::JobStatus*)>& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // Stores `update` (its member changes in a change record of their own;
  // the record, without its members, only when the job's state changes),
  // then applies it to the job's record.
  absl::Status RecordLocked(Job* job, absl::string_view job_id, int64_t round,
                            const HealthUpdate& update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  // The job `job_id`; NOT_FOUND for an unknown id.
  absl::StatusOr<std::shared_ptr<Job>> Find(absl::string_view job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every job, by id, as of now.
  std::vector<std::pair<std::string, std::shared_ptr<Job>>> Snapshot() const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::JobStatus> CreateLocked(const v1::JobConfig& normalized)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Storage* const storage_;
  Clock* const clock_;
  const JobLimits limits_;

  // The map of jobs; before a job's own lock when both are held.
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Job>, std::less<>> jobs_
      ABSL_GUARDED_BY(mu_);
  // Soft state: since this coordinator started.
  mutable absl::Mutex phases_mu_;
  std::map<std::string, PhaseHistogram> recovery_phases_
      ABSL_GUARDED_BY(phases_mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOB_MANAGER_H_
