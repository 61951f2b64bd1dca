// RendezvousManager's close of a round: which waiting processes form it
// (round_placement.h decides), the record of the round in the job's
// durable state (or the refusal when it cannot be written), and the round
// opened: members, assignments, the closed event before any answer leaves
// (see rendezvous_manager.h).
#include "server/rendezvous_manager.h"

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "server/round_placement.h"

namespace gradsync {

void RendezvousManager::CloseLocked(JobRendezvous* job,
                                    std::vector<Completion>* completions) {
  // Which waiting processes form the round, and how (round_placement.h).
  // A process whose replica diverged is no source of state while one that
  // did not came back with state.
  std::vector<std::list<Joiner>::iterator> joiners;
  std::vector<PlacementCandidate> candidates;
  bool trusted_state = false;
  for (auto it = job->pending.begin(); it != job->pending.end(); ++it) {
    const bool trusted =
        !job->distrusted_sources.contains(it->node.incarnation_id());
    trusted_state = trusted_state || (trusted && it->has_state);
    joiners.push_back(it);
    candidates.push_back({it->node.node_id(), &it->node, it->local_slot,
                          it->has_state && trusted, it->committed_step});
  }
  if (!trusted_state) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      candidates[i].has_state = joiners[i]->has_state;
    }
  }
  const Placement placement =
      PlaceRound(job->config, job->round + 1, candidates,
                 job->previous_round_nodes, job->remembered_node_rank);
  // The process of local rank `local` on the `i`-th chosen node, by node.
  ChosenProcesses chosen(placement.processes.size());
  for (size_t i = 0; i < placement.processes.size(); ++i) {
    for (int index : placement.processes[i]) {
      chosen[i].push_back(joiners[index]);
    }
  }
  // The round is recorded first; nothing here changes unless it was
  // (JobManager::RecordRoundClosed changes nothing when it fails).
  const absl::Status recorded = RecordCloseLocked(*job, placement, chosen);
  if (!recorded.ok()) {
    RefuseCloseLocked(job, placement.shape.round, chosen, recorded,
                      completions);
    return;
  }
  OpenRoundLocked(job, placement, chosen, completions);
}

absl::Status RendezvousManager::RecordCloseLocked(
    const JobRendezvous& job, const Placement& placement,
    const ChosenProcesses& chosen) {
  const RoundShape& shape = placement.shape;
  const int nproc = job.config.nproc_per_node();
  const absl::Time now = clock_->Now();
  std::vector<v1::Member> records(shape.world_size);
  for (size_t i = 0; i < chosen.size(); ++i) {
    for (int local = 0; local < nproc; ++local) {
      const int rank = placement.node_rank[i] * nproc + local;
      v1::Member& record = records[rank];
      record.set_rank(rank);
      record.set_local_rank(local);
      record.set_node_rank(placement.node_rank[i]);
      *record.mutable_node() = chosen[i][local]->node;
      record.set_state(v1::MEMBER_STATE_ACTIVE);
      *record.mutable_last_seen() = ToProtoTime(now);
    }
  }
  std::optional<v1::Recovery> recovery = job.recovery;
  if (recovery.has_value()) {
    recovery->set_new_round(shape.round);
    recovery->set_new_world_size(shape.world_size);
    recovery->set_resume_step(shape.resume_step);
    recovery->set_source_rank(shape.source_rank);
    recovery->set_resumed_in_place(shape.resumed_in_place);
    *recovery->mutable_round_close_time() = ToProtoTime(now);
    *recovery->mutable_rendezvous() =
        ToProtoDuration(now - FromProtoTime(recovery->detect_time()));
  }
  return jobs_->RecordRoundClosed(job.config.job_id(), shape.round,
                                  shape.backend, std::move(records),
                                  recovery.has_value() ? &*recovery : nullptr);
}

void RendezvousManager::RefuseCloseLocked(
    JobRendezvous* job, int64_t round,
    const ChosenProcesses& chosen,
    const absl::Status& recorded, std::vector<Completion>* completions) {
  // No assignment leaves unrecorded: a restart would restore the older
  // round. The chosen joins are refused (their clients retry); the rest of
  // the job is as it was.
  const std::string& job_id = job->config.job_id();
  GS_LOG(ERROR) << "job '" << job_id << "': could not record round " << round
                << ", so it did not close: " << recorded;
  const absl::Status refusal = absl::UnavailableError(absl::StrCat(
      "job '", job_id, "': round ", round,
      " could not be recorded, so it did not close (", recorded.message(),
      "); join again"));
  for (const auto& node : chosen) {
    for (std::list<Joiner>::iterator it : node) {
      completions->emplace_back(RemovePendingLocked(job, it), refusal);
    }
  }
}

void RendezvousManager::OpenRoundLocked(
    JobRendezvous* job, const Placement& placement,
    const ChosenProcesses& chosen,
    std::vector<Completion>* completions) {
  const RoundShape& shape = placement.shape;
  const int nproc = job->config.nproc_per_node();
  job->round = shape.round;
  CancelLastCallLocked(job);
  SetPhaseLocked(job, RoundPhase::kRunning);
  job->recovery.reset();
  job->distrusted_sources.clear();
  const bool follows_planned_reform = job->reform_as_planned;
  job->reform_as_planned = false;
  job->members.assign(shape.world_size, Member());
  job->member_by_incarnation.clear();
  job->node_rank_by_node.clear();
  job->previous_round_nodes.clear();
  job->awaited_nodes.clear();
  job->node_of_rank.assign(shape.world_size, std::string());
  // The listeners (the KV round opens) hear of it before any assignment
  // leaves (Finish).
  AddEventLocked(RoundEvent::Kind::kClosed, *job, std::string());
  const std::vector<int> shares = SharesForLocked(job, placement);
  for (size_t i = 0; i < chosen.size(); ++i) {
    const std::string& node_id = placement.nodes[i];
    const int node_rank = placement.node_rank[i];
    job->remembered_node_rank[node_id] = node_rank;
    job->node_rank_by_node[node_id] = node_rank;
    for (int local = 0; local < nproc; ++local) {
      const std::list<Joiner>::iterator it = chosen[i][local];
      const int rank = node_rank * nproc + local;
      Member& member = job->members[rank];
      member.node = it->node;
      member.joined = it->join_time;
      member.assignment = AssignmentFor(job->config, shape, rank, node_rank);
      member.assignment.set_follows_planned_reform(follows_planned_reform);
      *member.assignment.mutable_micro_batch_shares() = {shares.begin(),
                                                         shares.end()};
      job->member_by_incarnation[it->node.incarnation_id()] = rank;
      job->node_of_rank[rank] = node_id;
      completions->emplace_back(RemovePendingLocked(job, it),
                                member.assignment);
    }
  }
  GS_LOG(INFO) << "job '" << job->config.job_id() << "' round " << job->round
               << " closed: " << chosen.size() << " node(s), world size "
               << shape.world_size << ", backend " << BackendName(shape.backend)
               << (shape.resumed_in_place
                       ? absl::StrCat(", resume after step ", shape.resume_step,
                                      " from rank ", shape.source_rank)
                       : std::string(", no member holds training state"))
               << ", " << job->pending.size()
               << " spare process(es)";
}

}  // namespace gradsync
