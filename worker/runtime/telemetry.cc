#include "worker/runtime/telemetry.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_text.h"
#include "common/job_config.h"
#include "common/process_usage.h"

namespace gradsync {

Telemetry::Telemetry(HealthReporter* reporter, ObservedBackend* backend,
                     std::function<int64_t()> gpu_memory,
                     absl::Duration refresh_interval)
    : reporter_(reporter),
      backend_(backend),
      gpu_memory_(std::move(gpu_memory)) {
  metrics_.set_state(v1::WORKER_STATE_STARTING);
  reporter_->SetLiveFields([backend](v1::WorkerMetrics* m) {
    m->set_last_started_collective(
        static_cast<int64_t>(backend->last_started()));
    m->set_last_finished_collective(
        static_cast<int64_t>(backend->last_finished()));
  });
  refresher_ = std::thread([this, refresh_interval] {
    RefreshLoop(refresh_interval);
  });
}

Telemetry::~Telemetry() {
  reporter_->SetLiveFields(nullptr);
  stop_.Notify();
  refresher_.join();
}

void Telemetry::RefreshLoop(absl::Duration interval) {
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    absl::MutexLock lock(&mu_);
    PublishLocked();
  }
}

void Telemetry::PublishLocked() {
  metrics_.set_last_started_collective(
      static_cast<int64_t>(backend_->last_started()));
  metrics_.set_last_finished_collective(
      static_cast<int64_t>(backend_->last_finished()));
  metrics_.set_rss_bytes(ResidentBytes(0));
  if (gpu_memory_) metrics_.set_gpu_memory_bytes(gpu_memory_());
  reporter_->Update(metrics_);
  // Events go out once.
  metrics_.clear_recent_collectives();
  metrics_.clear_first_bucket_ready();
  metrics_.clear_replica_fingerprints();
}

void Telemetry::AddFingerprintLocked(int64_t step, const ReplicaDigest& digest) {
  v1::ReplicaFingerprint* f = metrics_.add_replica_fingerprints();
  f->set_step(step);
  f->mutable_tensors()->Add(digest.values.begin(), digest.values.end());
  if (fingerprint_names_sent_) return;
  fingerprint_names_sent_ = true;  // the round's first carries the names
  for (const std::string& name : digest.names) f->add_tensor_names(name);
}

void Telemetry::OnFingerprint(int64_t step, const ReplicaDigest& digest) {
  absl::MutexLock lock(&mu_);
  AddFingerprintLocked(step, digest);
  PublishLocked();
}

void Telemetry::SetRoundStart(absl::Duration process_group,
                              absl::Duration state_transfer,
                              absl::Duration first_step) {
  absl::MutexLock lock(&mu_);
  v1::RoundStartTimings* t = metrics_.mutable_round_start();
  *t->mutable_process_group() = ToProtoDuration(process_group);
  *t->mutable_state_transfer() = ToProtoDuration(state_transfer);
  *t->mutable_first_step() = ToProtoDuration(first_step);
}

absl::Status Telemetry::OnStep(const StepReport& report, int64_t samples) {
  {
    absl::MutexLock lock(&mu_);
    metrics_.set_state(v1::WORKER_STATE_TRAINING);
    metrics_.set_step(report.step);
    SetStepTimingsLocked(report, samples);
    SetMicroBatchesLocked(report);
    SetCollectivesLocked(report);
    if (report.fingerprint != nullptr) {
      AddFingerprintLocked(report.step, *report.fingerprint);
    }
    if (report.ddp.first_bucket_ready != absl::Time() &&
        report.ddp.first_bucket_ready != absl::InfiniteFuture()) {
      v1::StepReady* ready = metrics_.add_first_bucket_ready();
      ready->set_step(report.step);
      *ready->mutable_time() = ToProtoTime(report.ddp.first_bucket_ready);
    }
    PublishLocked();
  }
  const HealthReporter::Verdict verdict = reporter_->verdict();
  if (verdict.state == v1::JOB_STATE_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("the coordinator failed the job: ", verdict.reason));
  }
  return absl::OkStatus();
}

void Telemetry::SetStepTimingsLocked(const StepReport& report,
                                     int64_t samples) {
  const double seconds = absl::ToDoubleSeconds(report.step_time);
  if (seconds > 0) {
    const double rate = samples / seconds;
    // A moving average: one slow step should not make the table jump.
    samples_per_second_ = samples_per_second_ == 0
                              ? rate
                              : 0.8 * samples_per_second_ + 0.2 * rate;
  }
  metrics_.set_samples_per_second(samples_per_second_);
  v1::StepTimings* t = metrics_.mutable_step_timings();
  t->set_step_seconds(seconds);
  t->set_forward_seconds(absl::ToDoubleSeconds(report.ddp.forward));
  t->set_backward_seconds(absl::ToDoubleSeconds(report.ddp.backward_compute));
  t->set_communication_seconds(
      absl::ToDoubleSeconds(report.ddp.exposed_communication));
  t->set_hidden_communication_seconds(
      absl::ToDoubleSeconds(report.ddp.hidden_communication));
}

void Telemetry::SetMicroBatchesLocked(const StepReport& report) {
  if (report.micro_batches <= 0) {
    metrics_.clear_micro_batches();
    return;
  }
  // A moving average too: a heartbeat carries the latest of several steps.
  const double one = absl::ToDoubleSeconds(report.micro_batch_time);
  micro_batch_seconds_ = micro_batch_seconds_ == 0
                             ? one
                             : 0.8 * micro_batch_seconds_ + 0.2 * one;
  v1::MicroBatchLoad* load = metrics_.mutable_micro_batches();
  load->set_share(report.micro_batches);
  load->set_per_step(report.micro_batches_per_step);
  load->set_seconds(micro_batch_seconds_);
}

void Telemetry::SetCollectivesLocked(const StepReport& report) {
  // Bucket stats, and which bucket each collective of the step carried.
  std::map<uint64_t, int> bucket_of;
  metrics_.clear_buckets();
  for (const BucketTiming& b : report.ddp.bucket_timings) {
    bucket_of[b.sequence] = b.index;
    v1::BucketStats* stats = metrics_.add_buckets();
    stats->set_index(b.index);
    stats->set_bytes(b.bytes);
    const double s = absl::ToDoubleSeconds(b.allreduce);
    stats->set_allreduce_seconds(s);
    stats->set_algbw_bytes_per_second(s > 0 ? b.bytes / s : 0);
  }
  for (const CollectiveRecord& r : backend_->TakeRecords()) {
    v1::CollectiveFingerprint* f = metrics_.add_recent_collectives();
    f->set_sequence(static_cast<int64_t>(r.sequence));
    f->set_op(r.op);
    f->set_dtype(DataTypeName(r.dtype));
    f->set_count(r.count);
    auto it = bucket_of.find(r.sequence);
    f->set_bucket_index(it == bucket_of.end() ? -1 : it->second);
  }
}

void Telemetry::SetState(v1::WorkerState state) {
  absl::MutexLock lock(&mu_);
  metrics_.set_state(state);
  PublishLocked();
}

void Telemetry::SetError(const std::string& error) {
  absl::MutexLock lock(&mu_);
  metrics_.set_last_error(CutErrorText(error));
  PublishLocked();
}

}  // namespace gradsync
