#include "server/health_wire.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

constexpr int kMaxEvents = 256;
constexpr int kMaxBuckets = 4096;
constexpr size_t kMaxNameBytes = 64;
// Replica fingerprints per heartbeat (workers send at most 32), tensors per
// fingerprint, and the length of a tensor's name.
constexpr int kMaxFingerprints = 64;
constexpr int kMaxFingerprintTensors = 65536;
constexpr size_t kMaxTensorNameBytes = 256;
// Thread stacks (answering a stacks request): threads, frames per thread,
// and the length of a frame or a thread's name.
constexpr int kMaxThreads = 128;
constexpr int kMaxFrames = 48;
constexpr size_t kMaxFrameBytes = 256;

}  // namespace

absl::Status ValidateMemberRef(const v1::MemberRef& member) {
  GS_RETURN_IF_ERROR(ValidateJobId(member.job_id()));
  if (member.round() < 1 || member.rank() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "member.round must be >= 1 and member.rank >= 0, got round ",
        member.round(), " rank ", member.rank(),
        ": report with the Assignment of a closed round"));
  }
  if (member.incarnation_id().empty() ||
      member.incarnation_id().size() > kMaxIncarnationBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "member.incarnation_id must be 1-", kMaxIncarnationBytes,
        " bytes (the one the process joined with), got ",
        member.incarnation_id().size()));
  }
  return absl::OkStatus();
}

namespace {

// Replica fingerprints: a few per heartbeat, of a bounded number of tensors
// with bounded names.
absl::Status ValidateFingerprints(const v1::WorkerMetrics& m) {
  if (m.replica_fingerprints_size() > kMaxFingerprints) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics: at most ", kMaxFingerprints,
        " replica_fingerprints per heartbeat"));
  }
  for (const v1::ReplicaFingerprint& f : m.replica_fingerprints()) {
    if (f.step() <= 0 || f.tensors_size() > kMaxFingerprintTensors ||
        (f.tensor_names_size() != 0 &&
         f.tensor_names_size() != f.tensors_size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics.replica_fingerprints: step must be positive, tensors at "
          "most ", kMaxFingerprintTensors,
          ", and tensor_names empty or one per tensor"));
    }
    for (const std::string& name : f.tensor_names()) {
      if (name.size() > kMaxTensorNameBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "metrics.replica_fingerprints: tensor names are at most ",
            kMaxTensorNameBytes, " bytes"));
      }
    }
  }
  return absl::OkStatus();
}

// Thread stacks: bounded as ThreadStacks documents.
absl::Status ValidateThreadStacks(const v1::ThreadStacks& stacks) {
  if (stacks.threads_size() > kMaxThreads ||
      stacks.error().size() > kMaxErrorBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics.thread_stacks: at most ", kMaxThreads,
        " threads and an error of at most ", kMaxErrorBytes, " bytes"));
  }
  for (const v1::ThreadStack& t : stacks.threads()) {
    bool long_frame = false;
    for (const std::string& f : t.frames()) {
      long_frame = long_frame || f.size() > kMaxFrameBytes;
    }
    if (t.frames_size() > kMaxFrames || long_frame ||
        t.name().size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics.thread_stacks: at most ", kMaxFrames,
          " frames per thread, of at most ", kMaxFrameBytes,
          " bytes each, and thread names of at most ", kMaxNameBytes,
          " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateMetrics(const v1::WorkerMetrics& m) {
  if (m.step() < 0 || m.last_started_collective() < 0 ||
      m.last_finished_collective() < 0 || m.rss_bytes() < 0 ||
      m.gpu_memory_bytes() < 0 || m.pid() < 0) {
    return absl::InvalidArgumentError(
        "metrics: step, collective sequence numbers, memory sizes and pid "
        "must be >= 0");
  }
  if (m.recent_collectives_size() > kMaxEvents ||
      m.first_bucket_ready_size() > kMaxEvents ||
      m.buckets_size() > kMaxBuckets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics: at most ", kMaxEvents,
        " recent_collectives and first_bucket_ready entries and ", kMaxBuckets,
        " buckets per heartbeat"));
  }
  if (m.last_error().size() > kMaxErrorBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics.last_error is at most ", kMaxErrorBytes, " bytes"));
  }
  for (const v1::CollectiveFingerprint& f : m.recent_collectives()) {
    if (f.op().size() > kMaxNameBytes || f.dtype().size() > kMaxNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics.recent_collectives: op and dtype are at most ",
          kMaxNameBytes, " bytes"));
    }
  }
  GS_RETURN_IF_ERROR(ValidateFingerprints(m));
  GS_RETURN_IF_ERROR(ValidateThreadStacks(m.thread_stacks()));
  const v1::MicroBatchLoad& load = m.micro_batches();
  if (load.share() < 0 || load.per_step() < load.share() ||
      !(load.seconds() >= 0) || load.seconds() > 1e6) {
    return absl::InvalidArgumentError(
        "metrics.micro_batches: share and per_step must be >= 0 with share "
        "<= per_step, and seconds in [0, 1e6]");
  }
  for (const v1::StepReady& ready : m.first_bucket_ready()) {
    GS_RETURN_IF_ERROR(
        CheckProtoTime("metrics.first_bucket_ready.time", ready.time()));
  }
  const v1::RoundStartTimings& start = m.round_start();
  for (const auto& [field, d] :
       {std::make_pair("metrics.round_start.process_group", &start.process_group()),
        std::make_pair("metrics.round_start.state_transfer", &start.state_transfer()),
        std::make_pair("metrics.round_start.first_step", &start.first_step())}) {
    GS_RETURN_IF_ERROR(CheckProtoDuration(field, *d));
    if (FromProtoDuration(*d) < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(field, " is negative"));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradsync
