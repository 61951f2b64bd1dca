// What a job's record costs to keep: the job manager (server/job_manager)
// over a real backend, driven the way the rendezvous and failure detection
// drive it for one job of N members:
//   close   - round 1 closes with N members;
//   end     - every member reports completion (N health changes of one
//             member each; the last one ends the job SUCCEEDED);
//   recover - another job of N members loses one member, its round is
//             superseded, round 2 closes as a recovery and every member
//             reports how its start went (N round-start reports, stored
//             every 10 ms and after the last, as the coordinator's poll
//             stores them);
//   load    - a fresh job manager loads both jobs from the backend.
// Each phase prints its time and the bytes it made the backend write (keys
// and values of every put); the loaded records must equal the live ones.
// Growing linearly means per-member cost flat as N grows.
//
//   bazel-bin/bench/job_record_bench --members=10000,100000
//       --backends=memory,state[,etcd] [--etcd=127.0.0.1:2379]
// (bench/job_record_bench.sh starts an etcd and runs it so.)
#include <google/protobuf/util/message_differencer.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/job_config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/job_manager.h"
#include "server/storage/in_memory_storage.h"
#include "server/storage/open_storage.h"

ABSL_FLAG(std::string, members, "1000,10000,100000",
          "comma-separated job sizes (members)");
ABSL_FLAG(std::string, backends, "memory,state",
          "comma-separated: memory, state (SQLite in --state_root), etcd");
ABSL_FLAG(std::string, state_root, "/tmp/job_record_bench",
          "where each size's state directory is made (and removed)");
ABSL_FLAG(std::string, etcd, "", "etcd endpoints for the etcd backend");
ABSL_FLAG(absl::Duration, phase_limit, absl::Minutes(5),
          "a phase that runs longer stops there and says how far it got");

namespace gradsync {
namespace {

// Counts what is written through it; passes every call to `inner`.
class CountingStorage final : public Storage {
 public:
  explicit CountingStorage(Storage* inner) : inner_(inner) {}

  int64_t TakeBytes() {
    absl::MutexLock lock(&mu_);
    const int64_t bytes = bytes_;
    bytes_ = 0;
    return bytes;
  }

  absl::Status Put(absl::string_view key, absl::string_view value) override {
    Count(key.size() + value.size());
    return inner_->Put(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key) const override {
    return inner_->Get(key);
  }
  absl::StatusOr<bool> Delete(absl::string_view key) override {
    Count(key.size());
    return inner_->Delete(key);
  }
  absl::StatusOr<std::vector<Entry>> Scan(absl::string_view prefix,
                                          bool keys_only) const override {
    return inner_->Scan(prefix, keys_only);
  }
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override {
    Count(prefix.size());
    return inner_->DeletePrefix(prefix);
  }
  absl::Status Apply(const std::vector<Mutation>& batch) override {
    for (const Mutation& m : batch) Count(m.key.size() + m.value.size());
    return inner_->Apply(batch);
  }

 private:
  void Count(size_t bytes) {
    absl::MutexLock lock(&mu_);
    bytes_ += static_cast<int64_t>(bytes);
  }

  Storage* const inner_;
  absl::Mutex mu_;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Phase {
  absl::Duration time;
  int64_t bytes = 0;
  int64_t done = 0;  // operations completed (of the phase's N)
};

std::string Show(const Phase& p, int64_t n) {
  std::string s = absl::StrFormat("%8.3f s %9.1f MB", absl::ToDoubleSeconds(p.time),
                                  p.bytes / 1e6);
  if (p.done < n) absl::StrAppend(&s, absl::StrFormat(" (stopped at %d)", p.done));
  return s;
}

v1::JobConfig Config(absl::string_view id, int members) {
  v1::JobConfig config;
  config.set_job_id(std::string(id));
  config.set_min_nodes(members);
  config.set_max_nodes(members);
  config.set_nproc_per_node(1);
  return config;
}

// Members as the rendezvous records them.
std::vector<v1::Member> Members(int n, absl::string_view tag) {
  std::vector<v1::Member> members(n);
  for (int r = 0; r < n; ++r) {
    v1::Member& m = members[r];
    m.set_rank(r);
    m.set_node_rank(r);
    m.mutable_node()->set_node_id(absl::StrCat("node-", r));
    m.mutable_node()->set_hostname(absl::StrCat("host-", r, ".cluster.example"));
    m.mutable_node()->add_addresses(absl::StrCat("10.", r / 65536, ".",
                                                 (r / 256) % 256, ".", r % 256));
    m.mutable_node()->set_pid(100000 + r);
    m.mutable_node()->set_incarnation_id(absl::StrFormat("%s%030d", tag, r));
    m.set_state(v1::MEMBER_STATE_ACTIVE);
    m.mutable_last_seen()->set_seconds(1800000000);
  }
  return members;
}

// Runs `one(i)` for i in [0, n) until the limit; times it.
template <typename F>
absl::StatusOr<Phase> Run(CountingStorage* counted, int64_t n, F one) {
  counted->TakeBytes();
  Phase phase;
  const absl::Time start = absl::Now();
  const absl::Time stop = start + absl::GetFlag(FLAGS_phase_limit);
  for (; phase.done < n && absl::Now() < stop; ++phase.done) {
    GS_RETURN_IF_ERROR(one(phase.done));
  }
  phase.time = absl::Now() - start;
  phase.bytes = counted->TakeBytes();
  return phase;
}

absl::Status Bench(Storage* storage, absl::string_view backend, int n) {
  CountingStorage counted(storage);
  JobManager jobs(&counted, RealClock::Get());
  GS_RETURN_IF_ERROR(jobs.Create(Config("ending", n)).status());
  GS_RETURN_IF_ERROR(jobs.Create(Config("recovering", n)).status());
  GS_ASSIGN_OR_RETURN(Phase close, Run(&counted, 1, [&](int64_t) {
    return jobs.RecordRoundClosed("ending", 1, v1::BACKEND_GLOO, Members(n, "a"));
  }));
  GS_ASSIGN_OR_RETURN(Phase end, Run(&counted, n, [&](int64_t r) {
    HealthUpdate update;
    update.members.push_back({static_cast<int>(r), v1::MEMBER_STATE_EXITED,
                              "succeeded"});
    if (r == n - 1) {
      update.job_state = v1::JOB_STATE_SUCCEEDED;
      update.reason = "every member succeeded";
    }
    return jobs.RecordHealth("ending", 1, update);
  }));
  GS_RETURN_IF_ERROR(jobs.RecordRoundClosed("recovering", 1, v1::BACKEND_GLOO,
                                            Members(n, "a")));
  // The coordinator's default --poll_interval.
  constexpr absl::Duration kPollInterval = absl::Milliseconds(10);
  absl::Time last_save = absl::Now();
  GS_ASSIGN_OR_RETURN(Phase recover, Run(&counted, n + 1, [&](int64_t i) {
    if (i == 0) {
      HealthUpdate lost;
      lost.members.push_back({n / 2, v1::MEMBER_STATE_LOST, "missed 3 heartbeats"});
      lost.job_state = v1::JOB_STATE_DEGRADED;
      GS_RETURN_IF_ERROR(jobs.RecordHealth("recovering", 1, lost));
      GS_RETURN_IF_ERROR(jobs.RecordRoundSuperseded("recovering", "rank lost"));
      v1::Recovery recovery;
      recovery.set_failed_round(1);
      recovery.set_new_round(2);
      return jobs.RecordRoundClosed("recovering", 2, v1::BACKEND_GLOO,
                                    Members(n, "b"), &recovery);
    }
    v1::RoundStartTimings timings;
    timings.mutable_process_group()->set_nanos(static_cast<int32_t>(i));
    GS_RETURN_IF_ERROR(jobs.RecordRoundStart("recovering", 2, timings));
    if (i < n && absl::Now() - last_save < kPollInterval) {
      return absl::OkStatus();
    }
    last_save = absl::Now();
    return jobs.SaveRoundStarts();
  }));
  JobManager loaded(&counted, RealClock::Get());
  GS_ASSIGN_OR_RETURN(Phase load, Run(&counted, 1, [&](int64_t) {
    return loaded.LoadFromStorage();
  }));
  for (const char* id : {"ending", "recovering"}) {
    GS_ASSIGN_OR_RETURN(v1::JobStatus live, jobs.Get(id));
    GS_ASSIGN_OR_RETURN(v1::JobStatus back, loaded.Get(id));
    if (!google::protobuf::util::MessageDifferencer::Equals(live, back)) {
      return absl::DataLossError(absl::StrCat("job '", id, "' loaded differs"));
    }
  }
  std::printf("%-7s %7d | close %s | end %s, %6.1f us %6.0f B per member | "
              "recover %s | load %s\n",
              std::string(backend).c_str(), n, Show(close, 1).c_str(),
              Show(end, n).c_str(),
              absl::ToDoubleMicroseconds(end.time) / std::max<int64_t>(end.done, 1),
              static_cast<double>(end.bytes) / std::max<int64_t>(end.done, 1),
              Show(recover, n + 1).c_str(), Show(load, 1).c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Storage>> Open(absl::string_view backend, int n) {
  StorageSpec spec;
  if (backend == "state") {
    spec.state_dir = absl::StrCat(absl::GetFlag(FLAGS_state_root), "/", n);
    std::filesystem::remove_all(spec.state_dir);
    std::filesystem::create_directories(spec.state_dir);
  } else if (backend == "etcd") {
    spec.etcd = absl::GetFlag(FLAGS_etcd);
    spec.etcd_prefix = absl::StrCat("/job-record-bench-", n, "-",
                                    absl::ToUnixMicros(absl::Now()), "/");
  } else if (backend != "memory") {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend '", backend, "'"));
  }
  if (backend == "memory") return std::unique_ptr<Storage>(new InMemoryStorage());
  return OpenStorage(spec);
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  for (absl::string_view backend :
       absl::StrSplit(absl::GetFlag(FLAGS_backends), ',', absl::SkipEmpty())) {
    for (absl::string_view size :
         absl::StrSplit(absl::GetFlag(FLAGS_members), ',', absl::SkipEmpty())) {
      int n = 0;
      if (!absl::SimpleAtoi(size, &n) || n < 2) {
        std::fprintf(stderr, "bad --members entry '%s'\n", std::string(size).c_str());
        return 2;
      }
      auto storage = gradsync::Open(backend, n);
      absl::Status status =
          storage.ok() ? gradsync::Bench(storage->get(), backend, n) : storage.status();
      if (!status.ok()) {
        std::fprintf(stderr, "%s, %d members: %s\n", std::string(backend).c_str(),
                     n, status.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}
