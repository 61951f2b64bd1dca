#include "server/rendezvous_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/join_request.h"

namespace gradsync {

RendezvousManager::RendezvousManager(JobManager* jobs, Clock* clock,
                                     std::vector<RoundListener*> listeners)
    : jobs_(jobs), clock_(clock), listeners_(std::move(listeners)) {}

absl::StatusOr<v1::JobConfig> RendezvousManager::AdmitJoin(
    const std::vector<v1::JoinRequest>& processes) {
  const v1::JoinRequest& first = processes.front();
  GS_RETURN_IF_ERROR(ValidateJobId(first.job_id()));
  for (const v1::JoinRequest& process : processes) {
    GS_RETURN_IF_ERROR(CheckProcessJoin(process));
  }
  // Settings that create the job are checked before they do.
  if (HasJobSettings(first) && processes.size() > 1) {
    v1::JobConfig settings = first.config();
    if (settings.job_id().empty()) settings.set_job_id(first.job_id());
    absl::StatusOr<v1::JobConfig> normalized = NormalizeJobConfig(settings);
    if (normalized.ok()) GS_RETURN_IF_ERROR(CheckNodeSize(processes, *normalized));
  }
  GS_ASSIGN_OR_RETURN(
      v1::JobConfig config,
      jobs_->GetOrCreate(first.job_id(),
                         HasJobSettings(first) ? &first.config() : nullptr));
  for (const v1::JoinRequest& process : processes) {
    if (config.backend() == v1::BACKEND_NCCL && !CanUseNccl(process.node())) {
      return NcclRefusal(process);
    }
  }
  GS_RETURN_IF_ERROR(CheckNodeSize(processes, config));
  absl::StatusOr<JobPhase> phase = jobs_->GetPhase(first.job_id());
  if (phase.ok() && IsTerminal(phase->state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", first.job_id(), "' has ended (", JobStateName(phase->state),
        ": ", phase->reason, "); a new run needs a new job id"));
  }
  return config;
}

uint64_t RendezvousManager::Join(const v1::JoinRequest& request,
                                 JoinCallback done) {
  absl::StatusOr<v1::JobConfig> config = AdmitJoin({request});
  if (!config.ok()) {
    done(config.status());
    return 0;
  }
  uint64_t ticket = 0;
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    JoinLocked(JobFor(*config), request, std::move(done), &ticket,
               &completions);
  }
  Finish(std::move(completions));
  return ticket;
}

// Collects the assignments of a node join's processes and answers once:
// with all of them, or with the first error (then withdraws the others).
class RendezvousManager::NodeJoin {
 public:
  NodeJoin(RendezvousManager* manager, size_t processes, NodeJoinCallback done)
      : manager_(manager),
        assignments_(processes),
        tickets_(processes, 0),
        remaining_(processes),
        done_(std::move(done)) {}

  void SetTicket(size_t i, uint64_t ticket) {
    absl::MutexLock lock(&mu_);
    tickets_[i] = ticket;
  }

  std::vector<uint64_t> Tickets() const {
    absl::MutexLock lock(&mu_);
    return tickets_;
  }

  void Joined(size_t i, absl::StatusOr<v1::Assignment> assignment) {
    NodeJoinCallback done;
    absl::StatusOr<std::vector<v1::Assignment>> answer;
    std::vector<uint64_t> withdraw;
    {
      absl::MutexLock lock(&mu_);
      tickets_[i] = 0;
      --remaining_;
      if (done_ == nullptr) return;  // answered already
      if (!assignment.ok()) {
        answer = assignment.status();
        withdraw = tickets_;
      } else {
        assignments_[i] = *std::move(assignment);
        if (remaining_ > 0) return;
        answer = std::move(assignments_);
      }
      done = std::move(done_);
      done_ = nullptr;
    }
    done(std::move(answer));
    for (uint64_t ticket : withdraw) {
      if (ticket != 0) manager_->CancelJoin(ticket);
    }
  }

 private:
  RendezvousManager* const manager_;
  mutable absl::Mutex mu_;
  std::vector<v1::Assignment> assignments_ ABSL_GUARDED_BY(mu_);
  // Of the processes still waiting; 0 once answered.
  std::vector<uint64_t> tickets_ ABSL_GUARDED_BY(mu_);
  size_t remaining_ ABSL_GUARDED_BY(mu_);
  NodeJoinCallback done_ ABSL_GUARDED_BY(mu_);
};

std::vector<uint64_t> RendezvousManager::JoinNode(
    const v1::JoinNodeRequest& request, NodeJoinCallback done) {
  absl::StatusOr<std::vector<v1::JoinRequest>> processes =
      SplitNodeJoin(request);
  absl::StatusOr<v1::JobConfig> config =
      processes.ok() ? AdmitJoin(*processes)
                     : absl::StatusOr<v1::JobConfig>(processes.status());
  if (!config.ok()) {
    done(config.status());
    return {};
  }
  auto node = std::make_shared<NodeJoin>(this, processes->size(),
                                         std::move(done));
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    JobRendezvous* job = JobFor(*config);
    for (size_t i = 0; i < processes->size(); ++i) {
      uint64_t ticket = 0;
      JoinLocked(job, (*processes)[i],
                 [node, i](absl::StatusOr<v1::Assignment> assignment) {
                   node->Joined(i, std::move(assignment));
                 },
                 &ticket, &completions);
      node->SetTicket(i, ticket);
    }
  }
  Finish(std::move(completions));
  return node->Tickets();
}

RendezvousManager::JobRendezvous* RendezvousManager::JobFor(
    const v1::JobConfig& config) {
  std::unique_ptr<JobRendezvous>& job = rendezvous_[config.job_id()];
  if (job == nullptr) {
    job = std::make_unique<JobRendezvous>(RoundPhase::kForming, config);
  }
  return job.get();
}

void RendezvousManager::JoinLocked(JobRendezvous* job,
                                   const v1::JoinRequest& request,
                                   JoinCallback done, uint64_t* ticket,
                                   std::vector<Completion>* completions) {
  v1::NodeDescriptor node = request.node();
  node.set_node_id(NodeIdOf(node));
  if (job->phase == RoundPhase::kEnded) {
    // Admitted just before the job ended: nothing will form again.
    completions->emplace_back(
        std::move(done),
        absl::FailedPreconditionError(absl::StrCat(
            "job '", job->config.job_id(),
            "' has ended; a new run needs a new job id")));
    return;
  }
  if (RoundRuns(job->phase) &&
      JoinOfTheRunningRoundLocked(job, request, node, &done, completions)) {
    return;
  }
  ReplaceWaitingLocked(job, node, completions);

  absl::Time now = clock_->Now();
  Joiner joiner;
  joiner.ticket = next_ticket_++;
  joiner.node = std::move(node);
  joiner.has_state = request.has_state();
  joiner.committed_step = request.committed_step();
  joiner.local_slot = request.has_local_slot() ? request.local_slot() : -1;
  joiner.join_time = now;
  joiner.deadline = now + FromProtoDuration(job->config.join_timeout());
  joiner.done = std::move(done);
  *ticket = joiner.ticket;
  const std::string& job_id = job->config.job_id();
  ticket_job_[joiner.ticket] = job_id;
  join_deadlines_.emplace(joiner.deadline, joiner.ticket);
  auto it = job->pending.Add(std::move(joiner));
  GS_LOG(INFO) << "job '" << job_id << "': " << DescribeProcess(it->node)
               << (RoundRuns(job->phase) ? " joined as a spare" : " joined")
               << " (" << job->pending.complete_nodes()
               << " complete node(s), need "
               << job->config.min_nodes() << ":" << job->config.max_nodes()
               << ")";
  MaybeGrowLocked(job, it->node.node_id());
  MaybeCloseLocked(job, completions);
}

bool RendezvousManager::JoinOfTheRunningRoundLocked(
    JobRendezvous* job, const v1::JoinRequest& request,
    const v1::NodeDescriptor& node, JoinCallback* done,
    std::vector<Completion>* completions) {
  auto member = job->member_by_incarnation.find(node.incarnation_id());
  if (member != job->member_by_incarnation.end()) {
    const Member& m = job->members[member->second];
    if (request.last_round() < job->round) {
      // The answer to an earlier join was lost: repeat it.
      completions->emplace_back(std::move(*done), m.assignment);
      return true;
    }
    const bool planned = job->phase == RoundPhase::kReformRequested;
    const bool told = !planned && !request.rejoin_reason().empty();
    SupersedeLocked(
        job, planned ? job->reform_reason
             : told  ? request.rejoin_reason()
                     : absl::StrCat("rank ", m.assignment.rank(), " (",
                                    DescribeProcess(m.node),
                                    ") rejoined after round ", job->round));
    // A bare rejoin's cause gives way to the first loss reported before
    // the next round closes; a reason the rejoiner gave stays.
    job->cause_is_rejoin = !planned && !told;
    job->reform_as_planned = planned;
  } else if (job->node_rank_by_node.contains(node.node_id())) {
    SupersedeLocked(job, absl::StrCat(DescribeProcess(node),
                                      " restarted: a new process joined "
                                      "from a node of round ",
                                      job->round));
  }
  return false;
}

void RendezvousManager::ReplaceWaitingLocked(
    JobRendezvous* job, const v1::NodeDescriptor& node,
    std::vector<Completion>* completions) {
  const int nproc = job->config.nproc_per_node();
  auto same = job->pending.FindIncarnation(node.incarnation_id());
  if (same != job->pending.end()) {
    completions->emplace_back(
        RemovePendingLocked(job, same),
        absl::AbortedError("replaced by a newer join from the same process"));
  }
  if (job->pending.NodeComplete(node.node_id())) {
    completions->emplace_back(
        RemovePendingLocked(job, job->pending.OldestOf(node.node_id())),
        absl::AbortedError(absl::StrCat(
            "replaced by a newer process on node '", node.node_id(),
            "', which already had ", nproc,
            " waiting process(es) (nproc_per_node=", nproc, ")")));
  }
}

void RendezvousManager::SupersedeLocked(JobRendezvous* job,
                                        const std::string& reason,
                                        absl::Duration detection) {
  const std::string& job_id = job->config.job_id();
  SetPhaseLocked(job, RoundPhase::kSuperseded);
  job->reform_reason.clear();
  job->cause_is_rejoin = false;
  job->reform_as_planned = false;
  v1::Recovery& recovery = job->recovery.emplace();
  recovery.set_failed_round(job->round);
  recovery.set_cause(reason);
  recovery.set_old_world_size(static_cast<int32_t>(job->members.size()));
  *recovery.mutable_detect_time() = ToProtoTime(clock_->Now());
  *recovery.mutable_detection() = ToProtoDuration(detection);
  job->member_by_incarnation.clear();
  job->previous_round_nodes.clear();
  for (const auto& [node_id, rank] : job->node_rank_by_node) {
    job->previous_round_nodes.insert(node_id);
  }
  job->awaited_nodes = job->previous_round_nodes;
  job->node_rank_by_node.clear();
  job->members.clear();
  absl::Status recorded = jobs_->RecordRoundSuperseded(job_id, reason);
  if (!recorded.ok()) {
    GS_LOG(ERROR) << "job '" << job_id << "': could not record the end of round "
                  << job->round << ": " << recorded;
  }
  GS_LOG(INFO) << "job '" << job_id << "' round " << job->round
               << " superseded: " << reason;
  AddEventLocked(RoundEvent::Kind::kSuperseded, *job, reason);
}

void RendezvousManager::MaybeCloseLocked(JobRendezvous* job,
                                         std::vector<Completion>* completions) {
  if (job->phase != RoundPhase::kForming &&
      job->phase != RoundPhase::kLastCall &&
      job->phase != RoundPhase::kSuperseded) {
    return;
  }
  const v1::JobConfig& config = job->config;
  const bool reforming = !job->previous_round_nodes.empty();
  const bool awaited_back = !reforming || AwaitedBackLocked(*job);
  // Spares alone may reach MAX while nodes of the old round, which hold
  // the training state, are on their way back: they are awaited all the
  // same (they take places first).
  const int complete = job->pending.complete_nodes();
  if (complete >= config.max_nodes() && awaited_back) {
    CloseLocked(job, completions);
    return;
  }
  if (complete >= config.min_nodes() && reforming && awaited_back) {
    CloseLocked(job, completions);  // a re-formed round: nobody else to wait for
    return;
  }
  if (complete < config.min_nodes()) {
    if (job->phase == RoundPhase::kLastCall) {
      CancelLastCallLocked(job);
      SetPhaseLocked(job, reforming ? RoundPhase::kSuperseded
                                    : RoundPhase::kForming);
    }
    return;
  }
  absl::Time now = clock_->Now();
  if (job->phase != RoundPhase::kLastCall) {
    absl::Duration wait = FromProtoDuration(config.last_call_timeout());
    if (!awaited_back) wait = std::max(wait, kAwaitedGrace);
    job->last_call_deadline = now + wait;
    last_calls_.emplace(*job->last_call_deadline, config.job_id());
    SetPhaseLocked(job, RoundPhase::kLastCall);
  }
  if (*job->last_call_deadline <= now) CloseLocked(job, completions);
}

void RendezvousManager::MaybeGrowLocked(JobRendezvous* job,
                                        const std::string& node_id) {
  const int nodes = static_cast<int>(job->node_rank_by_node.size());
  if (job->phase != RoundPhase::kRunning || nodes >= job->config.max_nodes() ||
      job->pending.Waiting(node_id) != job->config.nproc_per_node()) {
    return;
  }
  job->reform_reason = absl::StrCat(
      "node '", node_id, "' joined while round ", job->round, " ran ", nodes,
      " of at most ", job->config.max_nodes(),
      " node(s): the round re-forms at a step boundary to admit it");
  GS_LOG(INFO) << "job '" << job->config.job_id() << "': " << job->reform_reason;
  SetPhaseLocked(job, RoundPhase::kReformRequested);
  AddEventLocked(RoundEvent::Kind::kReformRequested, *job, job->reform_reason);
}

bool RendezvousManager::AwaitedBackLocked(const JobRendezvous& job) const {
  for (const std::string& node_id : job.awaited_nodes) {
    if (!job.pending.NodeComplete(node_id)) return false;
  }
  return true;
}

void RendezvousManager::MemberLost(const std::string& job_id, int64_t round,
                                   int rank, const std::string& reason,
                                   absl::Duration detection) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    JobRendezvous* job = FindLocked(job_id);
    if (job == nullptr) return;
    if (job->round != round || rank < 0 ||
        rank >= static_cast<int>(job->node_of_rank.size())) {
      return;
    }
    if (job->phase == RoundPhase::kEnded) return;
    if (RoundRuns(job->phase)) {
      SupersedeLocked(job, reason, detection);
    } else if (job->cause_is_rejoin && job->recovery.has_value()) {
      // The survivors rejoined first; this loss is why.
      job->recovery->set_cause(reason);
      *job->recovery->mutable_detection() = ToProtoDuration(detection);
      job->cause_is_rejoin = false;
    }
    job->reform_as_planned = false;  // a member failed after all
    const std::string& node_id = job->node_of_rank[rank];
    if (job->awaited_nodes.erase(node_id) > 0) {
      GS_LOG(INFO) << "job '" << job_id << "': round " << round + 1
                   << " forms without node '" << node_id << "' (rank " << rank
                   << " of round " << round << " was lost)";
    }
    MaybeCloseLocked(job, &completions);
  }
  Finish(std::move(completions));
}

RendezvousManager::JobRendezvous* RendezvousManager::FindLocked(
    const std::string& job_id) {
  auto it = rendezvous_.find(job_id);
  return it == rendezvous_.end() ? nullptr : it->second.get();
}

RendezvousManager::JoinCallback RendezvousManager::RemovePendingLocked(
    JobRendezvous* job, PendingJoins::Iterator it) {
  Joiner joiner = job->pending.Take(it);
  ticket_job_.erase(joiner.ticket);
  join_deadlines_.erase({joiner.deadline, joiner.ticket});
  return std::move(joiner.done);
}

void RendezvousManager::CancelJoin(uint64_t ticket) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto owner = ticket_job_.find(ticket);
    if (owner == ticket_job_.end()) return;
    JobRendezvous* job = rendezvous_.at(owner->second).get();
    GS_LOG(INFO) << "job '" << owner->second << "': "
                 << DescribeProcess(job->pending.FindTicket(ticket)->node)
                 << " cancelled its join";
    completions.emplace_back(
        RemovePendingLocked(job, job->pending.FindTicket(ticket)),
        absl::CancelledError("the join was cancelled by its caller"));
    MaybeCloseLocked(job, &completions);
  }
  Finish(std::move(completions));
}

absl::Status RendezvousManager::Leave(const std::string& job_id,
                                      const std::string& incarnation_id) {
  // Malformed input is INVALID_ARGUMENT, as in every other call.
  absl::Status valid = ValidateJobId(job_id);
  if (!valid.ok()) return valid;
  if (incarnation_id.empty() || incarnation_id.size() > kMaxIncarnationBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "incarnation_id must be 1-", kMaxIncarnationBytes, " bytes, got ",
        incarnation_id.size()));
  }
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto job_it = rendezvous_.find(job_id);
    if (job_it == rendezvous_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job '", job_id, "' has no waiting processes"));
    }
    JobRendezvous* job = job_it->second.get();
    auto it = job->pending.FindIncarnation(incarnation_id);
    if (it == job->pending.end()) {
      return absl::NotFoundError(absl::StrCat("no process with incarnation '",
                                              incarnation_id,
                                              "' is waiting in job '", job_id,
                                              "'"));
    }
    GS_LOG(INFO) << "job '" << job_id << "': "
                 << DescribeProcess(it->node) << " left";
    completions.emplace_back(RemovePendingLocked(job, it),
                             absl::CancelledError("the process left the job"));
    MaybeCloseLocked(job, &completions);
  }
  Finish(std::move(completions));
  return absl::OkStatus();
}

void RendezvousManager::Poll() {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = clock_->Now();
    std::vector<JobRendezvous*> touched;
    while (!join_deadlines_.empty() && join_deadlines_.begin()->first <= now) {
      uint64_t ticket = join_deadlines_.begin()->second;
      JobRendezvous* job = rendezvous_.at(ticket_job_.at(ticket)).get();
      auto it = job->pending.FindTicket(ticket);
      std::string message = TimeoutMessageLocked(*job, *it);
      GS_LOG(WARNING) << "join timed out: " << DescribeProcess(it->node)
                      << ": " << message;
      completions.emplace_back(RemovePendingLocked(job, it),
                               absl::DeadlineExceededError(message));
      touched.push_back(job);
    }
    for (JobRendezvous* job : touched) MaybeCloseLocked(job, &completions);
    while (!last_calls_.empty() && last_calls_.begin()->first <= now) {
      std::string job_id = last_calls_.begin()->second;
      last_calls_.erase(last_calls_.begin());
      MaybeCloseLocked(rendezvous_.at(job_id).get(), &completions);
    }
  }
  Finish(std::move(completions));
}

std::string RendezvousManager::TimeoutMessageLocked(const JobRendezvous& job,
                                                    const Joiner& joiner) const {
  const v1::JobConfig& config = job.config;
  std::string waited =
      absl::FormatDuration(FromProtoDuration(config.join_timeout()));
  if (RoundRuns(job.phase)) {
    return absl::StrCat(
        "job '", config.job_id(), "' is running round ", job.round,
        "; this process waited ", waited,
        " as a spare and no new round formed: join again to keep waiting");
  }
  return absl::StrCat(
      "job '", config.job_id(), "' needs at least ", config.min_nodes(),
      " node(s) of ", config.nproc_per_node(), " process(es); within ", waited,
      " only ", job.pending.complete_nodes(), " complete node(s) joined (",
      job.pending.size(),
      " process(es) waiting): check that every node was started with the "
      "same job and can reach the coordinator");
}

}  // namespace gradsync
