#include "worker/runtime/step_report.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

absl::Status CheckDuration(const char* name, absl::Duration d) {
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a step report's ", name, " must be a finite time of 0 or more, not ",
        absl::FormatDuration(d)));
  }
  return absl::OkStatus();
}

absl::Status CheckCount(const char* name, int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a step report's ", name, " must be 0 or more, not ", count));
  }
  return absl::OkStatus();
}

absl::Status CheckTimings(const StepTimings& ddp) {
  for (const auto& [name, d] :
       {std::pair<const char*, absl::Duration>{"forward time", ddp.forward},
        {"backward compute time", ddp.backward_compute},
        {"communication time", ddp.communication},
        {"exposed communication time", ddp.exposed_communication},
        {"hidden communication time", ddp.hidden_communication}}) {
    if (absl::Status s = CheckDuration(name, d); !s.ok()) return s;
  }
  return CheckCount("bucket count", ddp.buckets);
}

}  // namespace

absl::Status CheckStepReport(const StepReport& report, int64_t samples) {
  if (report.step < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a step report's step is the committed step, 1 or more, not ",
        report.step));
  }
  for (const auto& [name, count] :
       {std::pair<const char*, int64_t>{"sample count", samples},
        {"epoch", report.epoch},
        {"micro_batches", report.micro_batches},
        {"micro_batches_per_step", report.micro_batches_per_step}}) {
    if (absl::Status s = CheckCount(name, count); !s.ok()) return s;
  }
  if (report.micro_batches > report.micro_batches_per_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step report's micro_batches (", report.micro_batches,
                     ") must not exceed its micro_batches_per_step (",
                     report.micro_batches_per_step, ")"));
  }
  for (const auto& [name, d] :
       {std::pair<const char*, absl::Duration>{"step time", report.step_time},
        {"commit wait", report.commit_wait},
        {"update time", report.update},
        {"micro-batch time", report.micro_batch_time}}) {
    if (absl::Status s = CheckDuration(name, d); !s.ok()) return s;
  }
  return CheckTimings(report.ddp);
}

}  // namespace gradsync
