#include "server/rendezvous_manager.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/local_placement.h"

namespace gradsync {
namespace {

constexpr size_t kMaxIdBytes = 253;
constexpr size_t kMaxIncarnationBytes = 128;
constexpr int kMaxAddresses = 64;
constexpr int kMaxDeviceCount = 1024;

// The node a process belongs to: its node_id, or its hostname by default.
const std::string& NodeIdOf(const v1::NodeDescriptor& node) {
  return node.node_id().empty() ? node.hostname() : node.node_id();
}

std::string DescribeProcess(const v1::NodeDescriptor& node) {
  return absl::StrCat("node '", node.node_id(), "' (host ", node.hostname(),
                      ", pid ", node.pid(), ")");
}

// Whether a join carries settings for its job: a config with anything set
// besides the job id. An absent or empty config means "use the job's".
bool HasJobSettings(const v1::JoinRequest& request) {
  if (!request.has_config()) return false;
  v1::JobConfig settings = request.config();
  settings.clear_job_id();
  return settings.ByteSizeLong() > 0;
}

absl::Status NcclRefusal(const v1::JoinRequest& request) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job '", request.job_id(), "' requires the nccl backend but ",
      DescribeProcess(request.node()),
      " reports no CUDA device with NCCL: start it on a GPU node or let "
      "the job use backend auto or gloo"));
}

// What every member's assignment of one round shares.
struct RoundShape {
  int64_t round = 0;
  int world_size = 0;
  int num_nodes = 0;
  v1::Backend backend = v1::BACKEND_UNSPECIFIED;
  int64_t resume_step = 0;
  int source_rank = 0;
  bool single_host = false;
};

v1::Assignment AssignmentFor(const v1::JobConfig& config,
                             const RoundShape& shape, int rank,
                             int node_rank) {
  const int nproc = config.nproc_per_node();
  v1::Assignment a;
  a.set_job_id(config.job_id());
  a.set_round(shape.round);
  a.set_rank(rank);
  a.set_local_rank(rank % nproc);
  a.set_world_size(shape.world_size);
  a.set_local_world_size(nproc);
  a.set_node_rank(node_rank);
  a.set_num_nodes(shape.num_nodes);
  a.set_backend(shape.backend);
  a.set_kv_prefix(KvRoundPrefix(config.job_id(), shape.round));
  a.set_resume_step(shape.resume_step);
  a.set_source_rank(shape.source_rank);
  a.set_failure_policy(config.failure_policy() == v1::FAILURE_POLICY_FAIL
                           ? v1::FAILURE_POLICY_FAIL
                           : v1::FAILURE_POLICY_RECOVER);
  a.set_single_host(shape.single_host);
  a.set_may_grow(shape.num_nodes < config.max_nodes());
  return a;
}

// Whether every process runs on one (named) host.
bool OnOneHost(const std::vector<v1::NodeDescriptor>& nodes) {
  return !nodes.empty() && !nodes.front().hostname().empty() &&
         std::all_of(nodes.begin(), nodes.end(),
                     [&](const v1::NodeDescriptor& d) {
                       return d.hostname() == nodes.front().hostname();
                     });
}

}  // namespace

absl::Status ValidateNodeDescriptor(const v1::NodeDescriptor& node) {
  if (node.incarnation_id().empty() ||
      node.incarnation_id().size() > kMaxIncarnationBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node.incarnation_id must be 1-", kMaxIncarnationBytes,
        " bytes (a random id per process start), got ",
        node.incarnation_id().size()));
  }
  if (node.node_id().empty() && node.hostname().empty()) {
    return absl::InvalidArgumentError(
        "node needs a node_id or a hostname to group its processes by");
  }
  if (node.node_id().size() > kMaxIdBytes ||
      node.hostname().size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node.node_id and node.hostname are at most ", kMaxIdBytes, " bytes"));
  }
  if (node.addresses_size() > kMaxAddresses) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node lists ", node.addresses_size(), " addresses; at most ",
        kMaxAddresses));
  }
  for (const std::string& address : node.addresses()) {
    if (address.empty() || address.size() > kMaxIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node.addresses entries must be 1-", kMaxIdBytes, " bytes"));
    }
  }
  if (node.pid() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.pid must be >= 0, got ", node.pid()));
  }
  if (!v1::DeviceType_IsValid(node.device_type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown node.device_type ", node.device_type()));
  }
  if (node.device_count() < 0 || node.device_count() > kMaxDeviceCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.device_count must be in [0, ", kMaxDeviceCount,
                     "], got ", node.device_count()));
  }
  return absl::OkStatus();
}

namespace {

// A node's processes (iterators to joiners) in local rank order
// (PlaceLocalRanks).
template <typename JoinerIt>
std::vector<JoinerIt> InLocalRankOrder(const std::vector<JoinerIt>& procs) {
  std::vector<int> slots;
  for (const JoinerIt& p : procs) slots.push_back(p->local_slot);
  const std::vector<int> local =
      PlaceLocalRanks(slots, static_cast<int>(procs.size()));
  std::vector<JoinerIt> ordered(procs.size());
  for (size_t i = 0; i < procs.size(); ++i) ordered[local[i]] = procs[i];
  return ordered;
}

}  // namespace

bool CanUseNccl(const v1::NodeDescriptor& node) {
  return node.nccl_available() &&
         (node.device_type() == v1::DEVICE_TYPE_CUDA ||
          node.device_type() == v1::DEVICE_TYPE_SIM) &&
         node.device_count() > 0;
}

std::pair<int64_t, int> ChooseResumeSource(
    const std::vector<std::pair<bool, int64_t>>& joins) {
  std::pair<int64_t, int> best = {0, 0};
  bool found = false;
  for (size_t i = 0; i < joins.size(); ++i) {
    const auto& [has_state, step] = joins[i];
    if (!has_state || (found && step <= best.first)) continue;
    best = {step, static_cast<int>(i)};
    found = true;
  }
  return best;
}

v1::Backend NegotiateBackend(v1::Backend preference,
                             const std::vector<v1::NodeDescriptor>& members) {
  if (preference == v1::BACKEND_GLOO || preference == v1::BACKEND_NCCL) {
    return preference;
  }
  // One kind of device: simulated GPUs cannot reach real ones.
  bool all_nccl =
      !members.empty() &&
      std::all_of(members.begin(), members.end(),
                  [&](const v1::NodeDescriptor& node) {
                    return CanUseNccl(node) &&
                           node.device_type() == members[0].device_type();
                  });
  return all_nccl ? v1::BACKEND_NCCL : v1::BACKEND_GLOO;
}

RendezvousManager::RendezvousManager(JobManager* jobs, KvManager* kv,
                                     Clock* clock,
                                     RoundEventCallback on_round_event)
    : jobs_(jobs),
      kv_(kv),
      clock_(clock),
      on_round_event_(std::move(on_round_event)) {}

absl::Status RendezvousManager::Restore() {
  absl::MutexLock lock(&mu_);
  for (const v1::JobStatus& listed : jobs_->List()) {
    const std::string& job_id = listed.config().job_id();
    if (listed.round() < 1 || IsTerminal(listed.state())) continue;
    absl::StatusOr<v1::JobStatus> record = jobs_->Get(job_id);
    if (!record.ok()) return record.status();
    std::unique_ptr<JobRendezvous>& job = rendezvous_[job_id];
    job = std::make_unique<JobRendezvous>();
    absl::Status restored = RestoreLocked(*record, job.get());
    if (!restored.ok()) {
      rendezvous_.erase(job_id);
      return restored;
    }
  }
  return absl::OkStatus();
}

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
  RoundShape shape;
  shape.round = record.round();
  shape.world_size = world;
  shape.num_nodes = world / nproc;
  shape.backend = record.backend();
  if (record.recoveries_size() > 0) {
    const v1::Recovery& last = record.recoveries(record.recoveries_size() - 1);
    if (last.new_round() == record.round()) {
      shape.resume_step = last.resume_step();
      shape.source_rank = last.source_rank();
    }
  }
  std::vector<v1::NodeDescriptor> nodes;
  for (const v1::Member& m : record.members()) nodes.push_back(m.node());
  shape.single_host = OnOneHost(nodes);

  job->config = config;
  job->round = record.round();
  job->running = record.state() != v1::JOB_STATE_WAITING;
  job->node_of_rank.assign(world, std::string());
  if (job->running) job->members.assign(world, Member());
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
    if (job->running) {
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
  if (!job->running) {
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
               << " restored, " << (job->running ? "running" : "re-forming")
               << ", " << world << " member(s)";
  return absl::OkStatus();
}

namespace {

absl::Status CheckProcessJoin(const v1::JoinRequest& request) {
  GS_RETURN_IF_ERROR(ValidateNodeDescriptor(request.node()));
  if (request.has_local_slot() && request.local_slot() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_slot must be >= 0, got ", request.local_slot()));
  }
  if (request.committed_step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "committed_step must be >= 0, got ", request.committed_step()));
  }
  // Refuse a node that cannot run NCCL a job forced to NCCL by this very
  // request before GetOrCreate can create the job: a refused join must not
  // leave a job behind, or its retry with another backend would meet a config
  // mismatch. (Invalid settings are left to GetOrCreate to report.)
  if (HasJobSettings(request) && !CanUseNccl(request.node())) {
    v1::JobConfig settings = request.config();
    if (settings.job_id().empty()) settings.set_job_id(request.job_id());
    absl::StatusOr<v1::JobConfig> normalized = NormalizeJobConfig(settings);
    if (settings.job_id() == request.job_id() && normalized.ok() &&
        normalized->backend() == v1::BACKEND_NCCL) {
      return NcclRefusal(request);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNodeSize(const std::vector<v1::JoinRequest>& processes,
                           const v1::JobConfig& config) {
  if (static_cast<int>(processes.size()) <= config.nproc_per_node()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "a node join lists ", processes.size(), " processes; job '",
      config.job_id(), "' runs ", config.nproc_per_node(),
      " per node (nproc_per_node)"));
}

absl::StatusOr<std::vector<v1::JoinRequest>> SplitNodeJoin(
    const v1::JoinNodeRequest& request) {
  if (request.processes().empty()) {
    return absl::InvalidArgumentError("a node join lists no processes");
  }
  std::vector<v1::JoinRequest> processes;
  absl::flat_hash_set<std::string> incarnations;
  for (const v1::ProcessJoin& process : request.processes()) {
    v1::JoinRequest& join = processes.emplace_back();
    join.set_job_id(request.job_id());
    if (request.has_config()) *join.mutable_config() = request.config();
    *join.mutable_node() = process.node();
    join.set_last_round(process.last_round());
    join.set_has_state(process.has_state());
    join.set_committed_step(process.committed_step());
    if (process.has_local_slot()) join.set_local_slot(process.local_slot());
    if (!incarnations.insert(process.node().incarnation_id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a node join lists incarnation '", process.node().incarnation_id(),
          "' twice: every process needs its own"));
    }
    if (NodeIdOf(process.node()) != NodeIdOf(request.processes(0).node())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a node join mixes nodes '", NodeIdOf(request.processes(0).node()),
          "' and '", NodeIdOf(process.node()),
          "': it carries the processes of one node"));
    }
  }
  return processes;
}

}  // namespace

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
  Run(std::move(completions));
  ReportRoundEvents();
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
  Run(std::move(completions));
  ReportRoundEvents();
  return node->Tickets();
}

RendezvousManager::JobRendezvous* RendezvousManager::JobFor(
    const v1::JobConfig& config) {
  std::unique_ptr<JobRendezvous>& job = rendezvous_[config.job_id()];
  if (job == nullptr) {
    job = std::make_unique<JobRendezvous>();
    job->config = config;
  }
  return job.get();
}

void RendezvousManager::JoinLocked(JobRendezvous* job,
                                   const v1::JoinRequest& request,
                                   JoinCallback done, uint64_t* ticket,
                                   std::vector<Completion>* completions) {
  v1::NodeDescriptor node = request.node();
  node.set_node_id(NodeIdOf(node));
  const std::string& incarnation = node.incarnation_id();
  const int nproc = job->config.nproc_per_node();

  if (job->running) {
    auto member = job->member_by_incarnation.find(incarnation);
    if (member != job->member_by_incarnation.end()) {
      const Member& m = job->members[member->second];
      if (request.last_round() < job->round) {
        // The answer to an earlier join was lost: repeat it.
        completions->emplace_back(std::move(done), m.assignment);
        return;
      }
      const bool planned = !job->reform_reason.empty();
      SupersedeLocked(
          job, planned ? job->reform_reason
                       : absl::StrCat("rank ", m.assignment.rank(), " (",
                                      DescribeProcess(m.node),
                                      ") rejoined after round ", job->round));
      job->cause_is_rejoin = !planned;
    } else if (job->node_rank_by_node.contains(node.node_id())) {
      SupersedeLocked(job, absl::StrCat(DescribeProcess(node),
                                        " restarted: a new process joined "
                                        "from a node of round ",
                                        job->round));
    }
  }

  auto same = job->by_incarnation.find(incarnation);
  if (same != job->by_incarnation.end()) {
    completions->emplace_back(
        RemovePendingLocked(job, same->second),
        absl::AbortedError("replaced by a newer join from the same process"));
  }
  auto count = job->pending_per_node.find(node.node_id());
  if (count != job->pending_per_node.end() && count->second >= nproc) {
    auto oldest = std::find_if(
        job->pending.begin(), job->pending.end(), [&](const Joiner& j) {
          return j.node.node_id() == node.node_id();
        });
    completions->emplace_back(
        RemovePendingLocked(job, oldest),
        absl::AbortedError(absl::StrCat(
            "replaced by a newer process on node '", node.node_id(),
            "', which already had ", nproc,
            " waiting process(es) (nproc_per_node=", nproc, ")")));
  }

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
  if (++job->pending_per_node[joiner.node.node_id()] == nproc) {
    ++job->complete_nodes;
  }
  auto it = job->pending.insert(job->pending.end(), std::move(joiner));
  job->by_ticket[it->ticket] = it;
  job->by_incarnation[it->node.incarnation_id()] = it;
  GS_LOG(INFO) << "job '" << job_id << "': " << DescribeProcess(it->node)
               << (job->running ? " joined as a spare" : " joined")
               << " (" << job->complete_nodes << " complete node(s), need "
               << job->config.min_nodes() << ":" << job->config.max_nodes()
               << ")";
  MaybeGrowLocked(job, it->node.node_id());
  MaybeCloseLocked(job, completions);
}

void RendezvousManager::SupersedeLocked(JobRendezvous* job,
                                        const std::string& reason,
                                        absl::Duration detection) {
  const std::string& job_id = job->config.job_id();
  job->running = false;
  job->reform_reason.clear();
  job->cause_is_rejoin = false;
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
  kv_->RetireRound(job_id, job->round);
  absl::Status recorded = jobs_->RecordRoundSuperseded(job_id, reason);
  if (!recorded.ok()) {
    GS_LOG(ERROR) << "job '" << job_id << "': could not record the end of round "
                  << job->round << ": " << recorded;
  }
  GS_LOG(INFO) << "job '" << job_id << "' round " << job->round
               << " superseded: " << reason;
  round_events_.push_back({job_id, job->round, RoundEvent::kSuperseded});
}

void RendezvousManager::ReportRoundEvents() {
  std::vector<PendingEvent> events;
  {
    absl::MutexLock lock(&mu_);
    events.swap(round_events_);
  }
  if (!on_round_event_) return;
  for (const PendingEvent& e : events) {
    on_round_event_(e.job_id, e.round, e.event);
  }
}

void RendezvousManager::MaybeCloseLocked(JobRendezvous* job,
                                         std::vector<Completion>* completions) {
  if (job->running) return;
  const v1::JobConfig& config = job->config;
  const bool reforming = !job->previous_round_nodes.empty();
  const bool awaited_back = !reforming || AwaitedBackLocked(*job);
  // Spares alone may reach MAX while nodes of the old round, which hold
  // the training state, are on their way back: they are awaited all the
  // same (they take places first).
  if (job->complete_nodes >= config.max_nodes() && awaited_back) {
    CloseLocked(job, completions);
    return;
  }
  if (job->complete_nodes >= config.min_nodes() && reforming && awaited_back) {
    CloseLocked(job, completions);  // a re-formed round: nobody else to wait for
    return;
  }
  if (job->complete_nodes < config.min_nodes()) {
    if (job->last_call_deadline.has_value()) {
      last_calls_.erase({*job->last_call_deadline, config.job_id()});
      job->last_call_deadline.reset();
    }
    return;
  }
  absl::Time now = clock_->Now();
  if (!job->last_call_deadline.has_value()) {
    absl::Duration wait = FromProtoDuration(config.last_call_timeout());
    if (!awaited_back) wait = std::max(wait, kAwaitedGrace);
    job->last_call_deadline = now + wait;
    last_calls_.emplace(*job->last_call_deadline, config.job_id());
  }
  if (*job->last_call_deadline <= now) CloseLocked(job, completions);
}

void RendezvousManager::MaybeGrowLocked(JobRendezvous* job,
                                        const std::string& node_id) {
  const int nodes = static_cast<int>(job->node_rank_by_node.size());
  if (!job->running || !job->reform_reason.empty() ||
      nodes >= job->config.max_nodes() ||
      job->pending_per_node[node_id] != job->config.nproc_per_node()) {
    return;
  }
  job->reform_reason = absl::StrCat(
      "node '", node_id, "' joined while round ", job->round, " ran ", nodes,
      " of at most ", job->config.max_nodes(),
      " node(s): the round re-forms at a step boundary to admit it");
  GS_LOG(INFO) << "job '" << job->config.job_id() << "': " << job->reform_reason;
  round_events_.push_back(
      {job->config.job_id(), job->round, RoundEvent::kReformRequested});
}

bool RendezvousManager::AwaitedBackLocked(const JobRendezvous& job) const {
  const int nproc = job.config.nproc_per_node();
  for (const std::string& node_id : job.awaited_nodes) {
    auto count = job.pending_per_node.find(node_id);
    if (count == job.pending_per_node.end() || count->second < nproc) {
      return false;
    }
  }
  return true;
}

void RendezvousManager::MemberLost(const std::string& job_id, int64_t round,
                                   int rank, const std::string& reason,
                                   absl::Duration detection) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = rendezvous_.find(job_id);
    if (it == rendezvous_.end()) return;
    JobRendezvous* job = it->second.get();
    if (job->round != round || rank < 0 ||
        rank >= static_cast<int>(job->node_of_rank.size())) {
      return;
    }
    if (job->running) {
      SupersedeLocked(job, reason, detection);
    } else if (job->cause_is_rejoin && job->recovery.has_value()) {
      // The survivors rejoined first; this loss is why.
      job->recovery->set_cause(reason);
      *job->recovery->mutable_detection() = ToProtoDuration(detection);
      job->cause_is_rejoin = false;
    }
    const std::string& node_id = job->node_of_rank[rank];
    if (job->awaited_nodes.erase(node_id) > 0) {
      GS_LOG(INFO) << "job '" << job_id << "': round " << round + 1
                   << " forms without node '" << node_id << "' (rank " << rank
                   << " of round " << round << " was lost)";
    }
    MaybeCloseLocked(job, &completions);
  }
  Run(std::move(completions));
  ReportRoundEvents();
}

void RendezvousManager::CloseLocked(JobRendezvous* job,
                                    std::vector<Completion>* completions) {
  const v1::JobConfig& config = job->config;
  const std::string& job_id = config.job_id();
  const int nproc = config.nproc_per_node();

  // The complete nodes in the order their first process joined.
  std::vector<std::string> node_order;
  absl::flat_hash_map<std::string, std::vector<std::list<Joiner>::iterator>>
      processes;
  for (auto it = job->pending.begin(); it != job->pending.end(); ++it) {
    auto& list = processes[it->node.node_id()];
    if (list.empty()) node_order.push_back(it->node.node_id());
    list.push_back(it);
  }
  // Nodes of the superseded round come back first, then the others (spares
  // included) in join order, up to max_nodes.
  std::vector<std::string> chosen;
  for (bool returning : {true, false}) {
    for (const std::string& node_id : node_order) {
      if (static_cast<int>(chosen.size()) == config.max_nodes()) break;
      if (static_cast<int>(processes[node_id].size()) == nproc &&
          job->previous_round_nodes.contains(node_id) == returning) {
        chosen.push_back(node_id);
      }
    }
  }
  const int num_nodes = static_cast<int>(chosen.size());

  // A returning node keeps its old node rank when it is free.
  std::vector<int> node_rank(num_nodes, -1);
  std::vector<bool> taken(num_nodes, false);
  for (int i = 0; i < num_nodes; ++i) {
    auto old = job->remembered_node_rank.find(chosen[i]);
    if (old != job->remembered_node_rank.end() && old->second < num_nodes &&
        !taken[old->second]) {
      node_rank[i] = old->second;
      taken[old->second] = true;
    }
  }
  int next_free = 0;
  for (int i = 0; i < num_nodes; ++i) {
    if (node_rank[i] >= 0) continue;
    while (taken[next_free]) ++next_free;
    node_rank[i] = next_free;
    taken[next_free] = true;
  }

  std::vector<v1::NodeDescriptor> descriptors;
  for (const std::string& node_id : chosen) {
    for (const auto& it : processes[node_id]) descriptors.push_back(it->node);
  }
  const v1::Backend backend = NegotiateBackend(config.backend(), descriptors);
  const int world_size = num_nodes * nproc;
  std::vector<std::pair<bool, int64_t>> states(world_size);
  for (int i = 0; i < num_nodes; ++i) {
    const std::vector<std::list<Joiner>::iterator> procs =
        InLocalRankOrder(processes[chosen[i]]);
    for (int local = 0; local < nproc; ++local) {
      const Joiner& joiner = *procs[local];
      states[node_rank[i] * nproc + local] = {joiner.has_state,
                                              joiner.committed_step};
    }
  }
  RoundShape shape;
  shape.round = job->round + 1;
  shape.world_size = world_size;
  shape.num_nodes = num_nodes;
  shape.backend = backend;
  std::tie(shape.resume_step, shape.source_rank) = ChooseResumeSource(states);
  shape.single_host = OnOneHost(descriptors);
  const int64_t resume_step = shape.resume_step;
  const int source_rank = shape.source_rank;

  // The round is recorded first; nothing here changes unless it was
  // (JobManager::RecordRoundClosed changes nothing when it fails).
  const int64_t round = job->round + 1;
  const absl::Time now = clock_->Now();
  std::vector<std::vector<std::list<Joiner>::iterator>> procs_of(num_nodes);
  std::vector<v1::Member> records(world_size);
  for (int i = 0; i < num_nodes; ++i) {
    procs_of[i] = InLocalRankOrder(processes[chosen[i]]);
    for (int local = 0; local < nproc; ++local) {
      const Joiner& joiner = *procs_of[i][local];
      const int rank = node_rank[i] * nproc + local;
      v1::Member& record = records[rank];
      record.set_rank(rank);
      record.set_local_rank(local);
      record.set_node_rank(node_rank[i]);
      *record.mutable_node() = joiner.node;
      record.set_state(v1::MEMBER_STATE_ACTIVE);
      *record.mutable_last_seen() = ToProtoTime(now);
    }
  }
  std::optional<v1::Recovery> recovery = job->recovery;
  if (recovery.has_value()) {
    recovery->set_new_round(round);
    recovery->set_new_world_size(world_size);
    recovery->set_resume_step(resume_step);
    recovery->set_source_rank(source_rank);
    *recovery->mutable_round_close_time() = ToProtoTime(now);
    *recovery->mutable_rendezvous() =
        ToProtoDuration(now - FromProtoTime(recovery->detect_time()));
  }
  const absl::Status recorded = jobs_->RecordRoundClosed(
      job_id, round, backend, std::move(records),
      recovery.has_value() ? &*recovery : nullptr);
  if (!recorded.ok()) {
    // No assignment leaves unrecorded: a restart would restore the older
    // round. The chosen joins are refused (their clients retry); the rest
    // of the job is as it was.
    GS_LOG(ERROR) << "job '" << job_id << "': could not record round "
                  << round << ", so it did not close: " << recorded;
    const absl::Status refusal = absl::UnavailableError(absl::StrCat(
        "job '", job_id, "': round ", round,
        " could not be recorded, so it did not close (", recorded.message(),
        "); join again"));
    for (const auto& procs : procs_of) {
      for (const auto& it : procs) {
        completions->emplace_back(RemovePendingLocked(job, it), refusal);
      }
    }
    return;
  }

  job->round = round;
  job->running = true;
  job->recovery.reset();
  job->members.assign(world_size, Member());
  job->member_by_incarnation.clear();
  job->node_rank_by_node.clear();
  job->previous_round_nodes.clear();
  job->awaited_nodes.clear();
  job->node_of_rank.assign(world_size, std::string());
  if (job->last_call_deadline.has_value()) {
    last_calls_.erase({*job->last_call_deadline, job_id});
    job->last_call_deadline.reset();
  }
  // The KV round opens before any assignment leaves (they leave once the
  // lock is released).
  kv_->OpenRound(job_id, job->round);
  for (int i = 0; i < num_nodes; ++i) {
    job->remembered_node_rank[chosen[i]] = node_rank[i];
    job->node_rank_by_node[chosen[i]] = node_rank[i];
    for (int local = 0; local < nproc; ++local) {
      Joiner& joiner = *procs_of[i][local];
      const int rank = node_rank[i] * nproc + local;
      Member& member = job->members[rank];
      member.node = joiner.node;
      member.joined = joiner.join_time;
      member.assignment = AssignmentFor(config, shape, rank, node_rank[i]);
      job->member_by_incarnation[joiner.node.incarnation_id()] = rank;
      job->node_of_rank[rank] = chosen[i];
      completions->emplace_back(RemovePendingLocked(job, procs_of[i][local]),
                                member.assignment);
    }
  }
  GS_LOG(INFO) << "job '" << job_id << "' round " << job->round << " closed: "
               << num_nodes << " node(s), world size " << world_size
               << ", backend " << BackendName(backend) << ", resume after step "
               << resume_step << " from rank " << source_rank << ", "
               << job->pending.size() << " spare process(es)";
}

RendezvousManager::JoinCallback RendezvousManager::RemovePendingLocked(
    JobRendezvous* job, std::list<Joiner>::iterator it) {
  const int nproc = job->config.nproc_per_node();
  auto count = job->pending_per_node.find(it->node.node_id());
  if (count->second == nproc) --job->complete_nodes;
  if (--count->second == 0) job->pending_per_node.erase(count);
  job->by_ticket.erase(it->ticket);
  job->by_incarnation.erase(it->node.incarnation_id());
  ticket_job_.erase(it->ticket);
  join_deadlines_.erase({it->deadline, it->ticket});
  JoinCallback done = std::move(it->done);
  job->pending.erase(it);
  return done;
}

void RendezvousManager::CancelJoin(uint64_t ticket) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto owner = ticket_job_.find(ticket);
    if (owner == ticket_job_.end()) return;
    JobRendezvous* job = rendezvous_.at(owner->second).get();
    GS_LOG(INFO) << "job '" << owner->second << "': "
                 << DescribeProcess(job->by_ticket.at(ticket)->node)
                 << " cancelled its join";
    completions.emplace_back(
        RemovePendingLocked(job, job->by_ticket.at(ticket)),
        absl::CancelledError("the join was cancelled by its caller"));
    MaybeCloseLocked(job, &completions);
  }
  Run(std::move(completions));
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
    auto it = job->by_incarnation.find(incarnation_id);
    if (it == job->by_incarnation.end()) {
      return absl::NotFoundError(absl::StrCat("no process with incarnation '",
                                              incarnation_id,
                                              "' is waiting in job '", job_id,
                                              "'"));
    }
    GS_LOG(INFO) << "job '" << job_id << "': "
                 << DescribeProcess(it->second->node) << " left";
    completions.emplace_back(RemovePendingLocked(job, it->second),
                             absl::CancelledError("the process left the job"));
    MaybeCloseLocked(job, &completions);
  }
  Run(std::move(completions));
  return absl::OkStatus();
}

void RendezvousManager::JobEnded(const std::string& job_id, v1::JobState state,
                                 const std::string& reason) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = rendezvous_.find(job_id);
    if (it == rendezvous_.end()) return;
    FailPendingLocked(
        it->second.get(),
        absl::FailedPreconditionError(absl::StrCat(
            "job '", job_id, "' has ended (", JobStateName(state), ": ", reason,
            ") while this process waited to join it; a new run needs a new "
            "job id")),
        &completions);
  }
  Run(std::move(completions));
}

void RendezvousManager::FailPendingLocked(JobRendezvous* job,
                                          const absl::Status& status,
                                          std::vector<Completion>* completions) {
  const std::string& job_id = job->config.job_id();
  while (!job->pending.empty()) {
    GS_LOG(INFO) << "job '" << job_id << "': "
                 << DescribeProcess(job->pending.front().node)
                 << " stops waiting: " << status.message();
    completions->emplace_back(RemovePendingLocked(job, job->pending.begin()),
                              status);
  }
  if (job->last_call_deadline.has_value()) {
    last_calls_.erase({*job->last_call_deadline, job_id});
    job->last_call_deadline.reset();
  }
}

void RendezvousManager::ForgetJob(const std::string& job_id) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = rendezvous_.find(job_id);
    if (it == rendezvous_.end()) return;
    FailPendingLocked(it->second.get(),
                      absl::FailedPreconditionError(absl::StrCat(
                          "job '", job_id, "' has ended: start a new job id")),
                      &completions);
    rendezvous_.erase(it);
  }
  Run(std::move(completions));
}

std::pair<int64_t, int64_t> RendezvousManager::CountPending() const {
  absl::MutexLock lock(&mu_);
  std::pair<int64_t, int64_t> counts = {0, 0};
  for (const auto& [id, job] : rendezvous_) {
    (job->running ? counts.second : counts.first) += job->pending.size();
  }
  return counts;
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
      auto it = job->by_ticket.at(ticket);
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
  Run(std::move(completions));
}

std::string RendezvousManager::TimeoutMessageLocked(const JobRendezvous& job,
                                                    const Joiner& joiner) const {
  const v1::JobConfig& config = job.config;
  std::string waited =
      absl::FormatDuration(FromProtoDuration(config.join_timeout()));
  if (job.running) {
    return absl::StrCat(
        "job '", config.job_id(), "' is running round ", job.round,
        "; this process waited ", waited,
        " as a spare and no new round formed: join again to keep waiting");
  }
  return absl::StrCat(
      "job '", config.job_id(), "' needs at least ", config.min_nodes(),
      " node(s) of ", config.nproc_per_node(), " process(es); within ", waited,
      " only ", job.complete_nodes, " complete node(s) joined (",
      job.pending.size(),
      " process(es) waiting): check that every node was started with the "
      "same job and can reach the coordinator");
}

void RendezvousManager::DescribeWaiting(const std::string& job_id,
                                        v1::JobStatus* status) const {
  absl::MutexLock lock(&mu_);
  auto it = rendezvous_.find(job_id);
  if (it == rendezvous_.end()) return;
  const JobRendezvous& job = *it->second;
  for (const Joiner& joiner : job.pending) {
    v1::Member* member =
        job.running ? status->add_spares() : status->add_waiting();
    member->set_rank(-1);
    member->set_local_rank(-1);
    member->set_node_rank(-1);
    *member->mutable_node() = joiner.node;
    member->set_state(job.running ? v1::MEMBER_STATE_SPARE
                                  : v1::MEMBER_STATE_WAITING);
    *member->mutable_last_seen() = ToProtoTime(joiner.join_time);
  }
}

void RendezvousManager::Run(std::vector<Completion> completions) {
  for (auto& [done, result] : completions) done(std::move(result));
}

}  // namespace gradsync
