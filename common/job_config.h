// Validation, defaults and names for the job-level types of gradsync.v1,
// shared by the coordinator, its client library and the CLI.
#ifndef GRADSYNC_COMMON_JOB_CONFIG_H_
#define GRADSYNC_COMMON_JOB_CONFIG_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {

// Defaults for JobConfig fields left at zero.
inline constexpr int kDefaultMinNodes = 1;
inline constexpr int kDefaultNprocPerNode = 1;
inline constexpr absl::Duration kDefaultJoinTimeout = absl::Minutes(10);
inline constexpr absl::Duration kDefaultLastCallTimeout = absl::Seconds(30);
// Upper bounds that keep a typo from creating an absurd job.
inline constexpr int kMaxNodes = 100000;
inline constexpr int kMaxNprocPerNode = 1024;
inline constexpr absl::Duration kMaxTimeout = absl::Hours(24);
inline constexpr int kMaxMissedHeartbeats = 1000;
// The longest incarnation id (a random id per process start) a process may
// give, in a join or with its heartbeats.
inline constexpr size_t kMaxIncarnationBytes = 128;

// OK when `job_id` is a DNS-label-like name: 1-63 characters of [a-z0-9-]
// that start and end with a letter or digit; INVALID_ARGUMENT otherwise.
absl::Status ValidateJobId(absl::string_view job_id);

// Parses torchrun's node range syntax: "N" (min = max = N) or "MIN:MAX".
absl::StatusOr<std::pair<int, int>> ParseNodeRange(absl::string_view text);

// Validates `config` and fills its defaults; INVALID_ARGUMENT naming the
// offending field otherwise. Normalizing twice gives the same result.
absl::StatusOr<v1::JobConfig> NormalizeJobConfig(const v1::JobConfig& config);

// True when two normalized configs describe the same job.
bool SameJobConfig(const v1::JobConfig& a, const v1::JobConfig& b);

// Duration <-> google.protobuf.Duration.
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);
google::protobuf::Duration ToProtoDuration(absl::Duration d);
// Time <-> google.protobuf.Timestamp.
absl::Time FromProtoTime(const google::protobuf::Timestamp& t);
google::protobuf::Timestamp ToProtoTime(absl::Time t);
// INVALID_ARGUMENT naming `field` unless `d` (`t`) is within the range its
// type documents (nanos in range and of the seconds' sign; a timestamp
// between the years 1 and 9999), which JSON and text output require.
absl::Status CheckProtoDuration(absl::string_view field,
                                const google::protobuf::Duration& d);
absl::Status CheckProtoTime(absl::string_view field,
                            const google::protobuf::Timestamp& t);

// Short lower-case names for people: "nccl", "running", "spare", "cuda".
std::string BackendName(v1::Backend backend);
std::string JobStateName(v1::JobState state);
std::string MemberStateName(v1::MemberState state);
std::string WorkerStateName(v1::WorkerState state);
std::string DeviceTypeName(v1::DeviceType type);

// Parses "cpu", "cuda" or "sim" (a simulated GPU).
absl::StatusOr<v1::DeviceType> ParseDeviceType(absl::string_view name);
// OK for the CPU, CUDA and SIM; INVALID_ARGUMENT for anything else (an
// unspecified or unknown value a library caller set).
absl::Status CheckDeviceType(v1::DeviceType type);

// Parses "auto", "gloo" or "nccl".
absl::StatusOr<v1::Backend> ParseBackend(absl::string_view name);

// Whether a process on `device` that asks for `backend` can be in a round
// that runs NCCL: a GPU or a simulated one, and a backend of auto (which
// negotiates NCCL when every node can run it) or nccl.
bool MayRunNccl(v1::DeviceType device, v1::Backend backend);

// Parses "recover" or "fail" ("" is UNSPECIFIED: the job's default, recover).
absl::StatusOr<v1::FailurePolicy> ParseFailurePolicy(absl::string_view name);

// Parses "heal" or "fail" ("" is UNSPECIFIED: the job's default, heal).
absl::StatusOr<v1::DivergencePolicy> ParseDivergencePolicy(
    absl::string_view name);

// Parses "rebalance" or "report" ("" is UNSPECIFIED: the job's default,
// rebalance).
absl::StatusOr<v1::StragglerPolicy> ParseStragglerPolicy(
    absl::string_view name);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_JOB_CONFIG_H_
