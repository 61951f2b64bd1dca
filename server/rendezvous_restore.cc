// RendezvousManager's restart on durable state: every running round as
// recorded, its members waiting to be heard from again (see
// rendezvous_manager.h).
#include "server/rendezvous_manager.h"

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/join_request.h"
#include "server/round_placement.h"

namespace gradsync {

absl::Status RendezvousManager::Restore() {
  {
    absl::MutexLock lock(&mu_);
    for (const v1::JobStatus& listed : jobs_->List()) {
      const std::string& job_id = listed.config().job_id();
      if (listed.round() < 1 || IsTerminal(listed.state())) continue;
      absl::StatusOr<v1::JobStatus> record = jobs_->Get(job_id);
      if (!record.ok()) return record.status();
      std::unique_ptr<JobRendezvous>& job = rendezvous_[job_id];
      // Where the record says the job is: its round runs, or was superseded.
      job = std::make_unique<JobRendezvous>(
          record->state() == v1::JOB_STATE_WAITING ? RoundPhase::kSuperseded
                                                   : RoundPhase::kRunning,
          record->config());
      absl::Status restored = RestoreLocked(*record, job.get());
      if (!restored.ok()) {
        rendezvous_.erase(job_id);
        return restored;
      }
    }
  }
  // The rounds recorded with a lost member were superseded just now.
  Finish({});
  return absl::OkStatus();
}

namespace {

// The shape of the round `record` holds (its assignments are made again).
RoundShape RecordedShape(const v1::JobStatus& record) {
  RoundShape shape;
  shape.round = record.round();
  shape.world_size = record.members_size();
  shape.num_nodes = record.members_size() / record.config().nproc_per_node();
  shape.backend = record.backend();
  if (record.recoveries_size() > 0) {
    const v1::Recovery& last = record.recoveries(record.recoveries_size() - 1);
    if (last.new_round() == record.round()) {
      shape.resume_step = last.resume_step();
      shape.source_rank = last.source_rank();
      shape.resumed_in_place = last.resumed_in_place();
    }
  }
  std::vector<v1::NodeDescriptor> nodes;
  for (const v1::Member& m : record.members()) nodes.push_back(m.node());
  shape.single_host = OnOneHost(nodes);
  return shape;
}

}  // namespace

absl::Status RendezvousManager::RestoreLocked(const v1::JobStatus& record,
                                              JobRendezvous* job) {
  const v1::JobConfig& config = record.config();
  const int nproc = config.nproc_per_node();
  const int world = record.members_size();
  if (nproc < 1 || world < 1 || world % nproc != 0) {
    return absl::DataLossError(absl::StrCat(
        "job '", config.job_id(), "': round ", record.round(), " has ", world,
        " member(s) recorded with ", nproc,
        " process(es) per node: the state is damaged"));
  }
  const RoundShape shape = RecordedShape(record);
  job->config = config;
  job->round = record.round();
  const bool running = RoundRuns(job->phase);
  job->node_of_rank.assign(world, std::string());
  if (running) job->members.assign(world, Member());
  std::vector<std::string> lost_nodes;
  for (int rank = 0; rank < world; ++rank) {
    const v1::Member& m = record.members(rank);
    const std::string& node_id = m.node().node_id();
    if (m.rank() != rank || m.node_rank() != rank / nproc || node_id.empty()) {
      return absl::DataLossError(absl::StrCat(
          "job '", config.job_id(), "': member ", rank, " of round ",
          record.round(), " is recorded as rank ", m.rank(), ", node rank ",
          m.node_rank(), ", node '", node_id, "': the state is damaged"));
    }
    job->node_of_rank[rank] = node_id;
    job->remembered_node_rank[node_id] = m.node_rank();
    if (m.state() == v1::MEMBER_STATE_LOST) lost_nodes.push_back(node_id);
    if (running) {
      Member& member = job->members[rank];
      member.node = m.node();
      member.joined = FromProtoTime(record.round_close_time());
      member.assignment = AssignmentFor(config, shape, rank, m.node_rank());
      job->member_by_incarnation[m.node().incarnation_id()] = rank;
      job->node_rank_by_node[node_id] = m.node_rank();
    } else {
      job->previous_round_nodes.insert(node_id);
      job->awaited_nodes.insert(node_id);
    }
  }
  if (!running) {
    // Superseded before the restart: what the recovery record knew then,
    // but for how long detection took.
    v1::Recovery& recovery = job->recovery.emplace();
    recovery.set_failed_round(job->round);
    recovery.set_cause(record.reason());
    recovery.set_old_world_size(world);
    *recovery.mutable_detect_time() = record.update_time();
  } else if (!lost_nodes.empty()) {
    SupersedeLocked(job, record.reason());
  }
  for (const std::string& node_id : lost_nodes) {
    job->awaited_nodes.erase(node_id);
  }
  GS_LOG(INFO) << "job '" << config.job_id() << "': round " << job->round
               << " restored, " << RoundPhaseName(job->phase)
               << ", " << world << " member(s)";
  return absl::OkStatus();
}

}  // namespace gradsync
