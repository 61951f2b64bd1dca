// libFuzzer harness of the coordinator's managers: the composition the
// coordinator builds (jobs, key-value store, rendezvous, failure
// detection, wired with its callbacks, on in-memory storage and a fake
// clock) is driven by a sequence of requests parsed from the input, every
// request type the gRPC handlers pass on (Rendezvous, KeyValue, Jobs,
// Monitor), with clock steps and polls between them. The managers must
// answer every request (each callback exactly once) and never crash; the
// sanitizers (address, undefined) watch the rest.
//
// Input: records of [kind byte][length byte][length bytes of a serialized
// request]; a record whose bytes do not parse as its request is skipped,
// as the gRPC layer would refuse it. tests/fuzz/run.sh builds and runs it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/logging.h"
#include "proto/gradsync/v1/health.pb.h"
#include "proto/gradsync/v1/jobs.pb.h"
#include "proto/gradsync/v1/kv.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "server/health_manager.h"
#include "server/job_manager.h"
#include "server/kv_manager.h"
#include "server/rendezvous_manager.h"
#include "server/storage/in_memory_storage.h"

namespace gradsync {
namespace {

// The coordinator's managers as Coordinator wires them.
struct Managers {
  InMemoryStorage storage;
  FakeClock clock;
  JobManager jobs{&storage, &clock};
  KvManager kv{&storage, &clock, &jobs};
  // The store and the monitoring follow the rendezvous's round events
  // (`health` is constructed next; only its address is taken here).
  RendezvousManager rendezvous{&jobs, &clock, {&kv, &health}};
  HealthManager health{
      &jobs, &clock, HealthConfig(),
      [this](const HealthManager::Loss& loss) {
        rendezvous.MemberLost(loss.job_id, loss.round, loss.rank, loss.reason,
                              loss.detection);
      },
      [this](const std::string& job_id, v1::JobState state,
             const std::string& reason) {
        rendezvous.JobEnded(job_id, state, reason);
      }};
};

// Counts answers: every callback must run exactly once.
struct Answers {
  int expected = 0;
  int got = 0;
  template <typename T>
  std::function<void(T)> Expect() {
    ++expected;
    return [this](T) { ++got; };
  }
};

KvScope ScopeOf(const v1::Scope& scope) { return {scope.job_id(), scope.round()}; }

template <typename Message>
bool Parse(const uint8_t* data, size_t size, Message* out) {
  return out->ParseFromArray(data, static_cast<int>(size));
}

// Applies one record of kind `kind`.
void Apply(Managers& m, Answers& answers,
           std::vector<std::unique_ptr<HealthManager::Session>>& sessions,
           uint8_t kind, const uint8_t* data, size_t size) {
  switch (kind % 16) {
    case 0: {
      v1::JoinRequest r;
      if (Parse(data, size, &r)) {
        m.rendezvous.Join(
            r, answers.Expect<absl::StatusOr<v1::Assignment>>());
      }
      break;
    }
    case 1: {
      v1::JoinNodeRequest r;
      if (Parse(data, size, &r)) {
        for (uint64_t ticket : m.rendezvous.JoinNode(
                 r, answers.Expect<
                        absl::StatusOr<std::vector<v1::Assignment>>>())) {
          if (size % 3 == 0) m.rendezvous.CancelJoin(ticket);
        }
      }
      break;
    }
    case 2: {
      v1::LeaveRequest r;
      if (Parse(data, size, &r)) {
        m.rendezvous.Leave(r.job_id(), r.incarnation_id()).IgnoreError();
      }
      break;
    }
    case 3: {
      v1::SetRequest r;
      if (Parse(data, size, &r)) {
        m.kv.Set(ScopeOf(r.scope()), r.key(), r.value()).IgnoreError();
      }
      break;
    }
    case 4: {
      v1::GetRequest r;
      if (Parse(data, size, &r)) {
        m.kv.Get(ScopeOf(r.scope()), r.key()).status().IgnoreError();
      }
      break;
    }
    case 5: {
      v1::AddRequest r;
      if (Parse(data, size, &r)) {
        m.kv.Add(ScopeOf(r.scope()), r.key(), r.delta()).status().IgnoreError();
      }
      break;
    }
    case 6: {
      v1::CompareAndSetRequest r;
      if (Parse(data, size, &r)) {
        m.kv.CompareAndSet(ScopeOf(r.scope()), r.key(), r.expected(),
                           r.expect_absent(), r.desired())
            .status()
            .IgnoreError();
      }
      break;
    }
    case 7: {
      v1::WaitRequest r;
      if (Parse(data, size, &r)) {
        uint64_t ticket = m.kv.Wait(
            ScopeOf(r.scope()), {r.keys().begin(), r.keys().end()},
            absl::Milliseconds(r.timeout_ms()),
            answers.Expect<absl::Status>());
        if (size % 2 == 0) m.kv.CancelWait(ticket);
      }
      break;
    }
    case 8: {
      v1::DeleteRequest r;
      if (Parse(data, size, &r)) {
        m.kv.Delete(ScopeOf(r.scope()), r.key()).status().IgnoreError();
      }
      break;
    }
    case 9: {
      v1::ListRequest r;
      if (Parse(data, size, &r)) {
        m.kv.List(ScopeOf(r.scope()), r.prefix(), r.keys_only())
            .status()
            .IgnoreError();
      }
      break;
    }
    case 10: {
      v1::CreateJobRequest r;
      if (Parse(data, size, &r)) m.jobs.Create(r.config()).status().IgnoreError();
      break;
    }
    case 11: {
      v1::GetJobRequest r;
      if (Parse(data, size, &r)) {
        JobManager::MemberSelection selection;
        selection.rank_from = r.members().rank_from();
        selection.rank_to = r.members().rank_to();
        selection.limit = r.members().page_size();
        v1::JobStatus status;
        if (m.jobs.CopySelected(r.job_id(), selection, &status).ok()) {
          m.rendezvous.DescribeWaiting(r.job_id(), &status);
          m.health.Describe(&status, r.with_buckets());
          m.health.Summarize(&status);
        }
      }
      break;
    }
    case 12: {
      v1::NodeHeartbeatRequest r;
      if (Parse(data, size, &r)) {
        if (sessions.empty() || size % 4 == 0) {
          sessions.push_back(HealthManager::NewSession());
        }
        for (v1::HeartbeatRequest& h : *r.mutable_heartbeats()) {
          v1::HeartbeatResponse response;
          m.health.Heartbeat(sessions.back().get(), &h, &response)
              .status()
              .IgnoreError();
        }
      }
      break;
    }
    case 13: {
      v1::ReportCompletionRequest r;
      if (Parse(data, size, &r)) m.health.ReportCompletion(r).status().IgnoreError();
      break;
    }
    case 14: {  // a stream breaks
      if (!sessions.empty()) {
        m.health.StreamBroken(sessions.back().get());
        sessions.pop_back();
      }
      break;
    }
    default: {  // time passes
      m.clock.Advance(absl::Milliseconds(size > 0 ? data[0] * 250 : 1000));
      m.rendezvous.Poll();
      m.kv.Poll();
      m.health.Poll();
      break;
    }
  }
}

}  // namespace
}  // namespace gradsync

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gradsync::SetMinLogSeverity(gradsync::LogSeverity::kFatal);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  Answers answers;
  {
    Managers m;
    std::vector<std::unique_ptr<HealthManager::Session>> sessions;
    size_t at = 0;
    while (at + 2 <= size) {
      const uint8_t kind = data[at];
      const size_t length = std::min<size_t>(data[at + 1], size - at - 2);
      Apply(m, answers, sessions, kind, data + at + 2, length);
      at += 2 + length;
    }
    // Whatever still waits ends: the jobs are forgotten.
    m.clock.Advance(absl::Hours(2));
    m.rendezvous.Poll();
    m.kv.Poll();
    m.health.Poll();
    for (const std::string& job : m.jobs.EndedBefore(absl::InfiniteFuture())) {
      m.rendezvous.ForgetJob(job);  // and, through its event, kv and health
      m.jobs.ForgetIfEndedBefore(job, absl::InfiniteFuture());
    }
    for (const v1::JobStatus& job : m.jobs.List()) {
      m.rendezvous.ForgetJob(job.config().job_id());
    }
  }
  // Every join and wait was answered, once: none left hanging when its job
  // was forgotten, none answered twice.
  if (answers.got != answers.expected) std::abort();
  return 0;
}
