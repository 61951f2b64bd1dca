#include "common/job_config.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/job.pb.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

v1::JobConfig ConfigWithId(const std::string& id) {
  v1::JobConfig config;
  config.set_job_id(id);
  return config;
}

// ---------------------------------------------------------------------------
// ValidateJobId

TEST(ValidateJobIdTest, AcceptsDnsLabels) {
  for (const char* id :
       {"a", "0", "job", "job-1", "a-b-c", "1abc9", "x0-y1-z2"}) {
    EXPECT_TRUE(ValidateJobId(id).ok()) << id;
  }
}

TEST(ValidateJobIdTest, AcceptsExactly63Characters) {
  EXPECT_TRUE(ValidateJobId(std::string(63, 'a')).ok());
}

TEST(ValidateJobIdTest, RejectsMoreThan63Characters) {
  absl::Status status = ValidateJobId(std::string(64, 'a'));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("is not a DNS label"));
}

TEST(ValidateJobIdTest, RejectsEmptyId) {
  absl::Status status = ValidateJobId("");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("empty"));
}

TEST(ValidateJobIdTest, RejectsBadCharactersAndHyphenAtEitherEnd) {
  for (const char* id : {"-job", "job-", "-", "Job", "JOB", "job_1", "job.1",
                         "job 1", "job/1", "jöb"}) {
    absl::Status status = ValidateJobId(id);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(status.message(), HasSubstr("is not a DNS label")) << id;
  }
}

// ---------------------------------------------------------------------------
// ParseNodeRange

TEST(ParseNodeRangeTest, SingleNumberIsMinAndMax) {
  absl::StatusOr<std::pair<int, int>> range = ParseNodeRange("4");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, std::make_pair(4, 4));
}

TEST(ParseNodeRangeTest, MinColonMax) {
  absl::StatusOr<std::pair<int, int>> range = ParseNodeRange("2:8");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, std::make_pair(2, 8));
}

TEST(ParseNodeRangeTest, EqualMinAndMax) {
  absl::StatusOr<std::pair<int, int>> range = ParseNodeRange("3:3");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range, std::make_pair(3, 3));
}

TEST(ParseNodeRangeTest, RejectsMalformedOrOutOfOrderRanges) {
  for (const char* text :
       {"", "0", "-1", "0:2", "4:2", "a", "2:", ":2", "1:2:3", "2:b", "1.5"}) {
    absl::StatusOr<std::pair<int, int>> range = ParseNodeRange(text);
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << text << "'";
    EXPECT_THAT(range.status().message(), HasSubstr("is not N or MIN:MAX"))
        << "'" << text << "'";
  }
}

// ---------------------------------------------------------------------------
// NormalizeJobConfig

TEST(NormalizeJobConfigTest, FillsEveryDefault) {
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(ConfigWithId("j"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job_id(), "j");
  EXPECT_EQ(config->min_nodes(), kDefaultMinNodes);
  EXPECT_EQ(config->max_nodes(), kDefaultMinNodes);
  EXPECT_EQ(config->nproc_per_node(), kDefaultNprocPerNode);
  EXPECT_EQ(FromProtoDuration(config->join_timeout()), kDefaultJoinTimeout);
  EXPECT_EQ(FromProtoDuration(config->join_timeout()), absl::Minutes(10));
  ASSERT_TRUE(config->has_last_call_timeout());
  EXPECT_EQ(FromProtoDuration(config->last_call_timeout()),
            kDefaultLastCallTimeout);
  EXPECT_EQ(FromProtoDuration(config->last_call_timeout()), absl::Seconds(30));
  EXPECT_EQ(config->backend(), v1::BACKEND_AUTO);
}

TEST(NormalizeJobConfigTest, MaxNodesDefaultsToMinNodes) {
  v1::JobConfig in = ConfigWithId("j");
  in.set_min_nodes(3);
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->min_nodes(), 3);
  EXPECT_EQ(config->max_nodes(), 3);
}

TEST(NormalizeJobConfigTest, MinNodesDefaultsToOneBelowAGivenMax) {
  v1::JobConfig in = ConfigWithId("j");
  in.set_max_nodes(5);
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->min_nodes(), 1);
  EXPECT_EQ(config->max_nodes(), 5);
}

TEST(NormalizeJobConfigTest, KeepsExplicitValues) {
  v1::JobConfig in = ConfigWithId("train-7");
  in.set_min_nodes(2);
  in.set_max_nodes(4);
  in.set_nproc_per_node(8);
  *in.mutable_join_timeout() = ToProtoDuration(absl::Seconds(90));
  *in.mutable_last_call_timeout() = ToProtoDuration(absl::Milliseconds(2500));
  in.set_backend(v1::BACKEND_NCCL);
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(SameJobConfig(*config, in));
}

TEST(NormalizeJobConfigTest, ExplicitZeroLastCallTimeoutStaysZero) {
  v1::JobConfig in = ConfigWithId("j");
  *in.mutable_last_call_timeout() = ToProtoDuration(absl::ZeroDuration());
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->has_last_call_timeout());
  EXPECT_EQ(FromProtoDuration(config->last_call_timeout()),
            absl::ZeroDuration());
  // And it survives a second normalization.
  absl::StatusOr<v1::JobConfig> again = NormalizeJobConfig(*config);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(FromProtoDuration(again->last_call_timeout()),
            absl::ZeroDuration());
}

TEST(NormalizeJobConfigTest, ZeroJoinTimeoutMeansTheDefault) {
  v1::JobConfig in = ConfigWithId("j");
  *in.mutable_join_timeout() = ToProtoDuration(absl::ZeroDuration());
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(FromProtoDuration(config->join_timeout()), kDefaultJoinTimeout);
}

TEST(NormalizeJobConfigTest, IsIdempotent) {
  v1::JobConfig in = ConfigWithId("j");
  in.set_min_nodes(2);
  absl::StatusOr<v1::JobConfig> once = NormalizeJobConfig(in);
  ASSERT_TRUE(once.ok()) << once.status();
  absl::StatusOr<v1::JobConfig> twice = NormalizeJobConfig(*once);
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_TRUE(SameJobConfig(*once, *twice));
}

TEST(NormalizeJobConfigTest, RejectsBadJobId) {
  absl::StatusOr<v1::JobConfig> config =
      NormalizeJobConfig(ConfigWithId("Bad_Id"));
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("job id"));
}

TEST(NormalizeJobConfigTest, RejectsMissingJobId) {
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(v1::JobConfig());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("empty"));
}

TEST(NormalizeJobConfigTest, RejectsMaxBelowMin) {
  v1::JobConfig in = ConfigWithId("j");
  in.set_min_nodes(4);
  in.set_max_nodes(2);
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("nodes 4:2"));
}

TEST(NormalizeJobConfigTest, RejectsNegativeMinNodes) {
  v1::JobConfig in = ConfigWithId("j");
  in.set_min_nodes(-1);
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("nodes"));
}

TEST(NormalizeJobConfigTest, RejectsMoreThanMaxNodes) {
  v1::JobConfig in = ConfigWithId("j");
  in.set_max_nodes(kMaxNodes + 1);
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("nodes"));

  in.set_max_nodes(kMaxNodes);
  EXPECT_TRUE(NormalizeJobConfig(in).ok());
}

TEST(NormalizeJobConfigTest, RejectsNprocPerNodeOutOfRange) {
  for (int nproc : {-1, kMaxNprocPerNode + 1}) {
    v1::JobConfig in = ConfigWithId("j");
    in.set_nproc_per_node(nproc);
    absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << nproc;
    EXPECT_THAT(config.status().message(), HasSubstr("nproc_per_node"))
        << nproc;
  }
  v1::JobConfig in = ConfigWithId("j");
  in.set_nproc_per_node(kMaxNprocPerNode);
  EXPECT_TRUE(NormalizeJobConfig(in).ok());
}

TEST(NormalizeJobConfigTest, RejectsNegativeOrHugeJoinTimeout) {
  for (absl::Duration d : {-absl::Seconds(1), kMaxTimeout + absl::Seconds(1)}) {
    v1::JobConfig in = ConfigWithId("j");
    *in.mutable_join_timeout() = ToProtoDuration(d);
    absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(config.status().message(), HasSubstr("join_timeout")) << d;
  }
}

TEST(NormalizeJobConfigTest, RejectsNegativeOrHugeLastCallTimeout) {
  for (absl::Duration d : {-absl::Seconds(1), kMaxTimeout + absl::Seconds(1)}) {
    v1::JobConfig in = ConfigWithId("j");
    *in.mutable_last_call_timeout() = ToProtoDuration(d);
    absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(config.status().message(), HasSubstr("last_call_timeout")) << d;
  }
}

TEST(NormalizeJobConfigTest, AcceptsTimeoutsOfExactlyTheMaximum) {
  v1::JobConfig in = ConfigWithId("j");
  *in.mutable_join_timeout() = ToProtoDuration(kMaxTimeout);
  *in.mutable_last_call_timeout() = ToProtoDuration(kMaxTimeout);
  EXPECT_TRUE(NormalizeJobConfig(in).ok());
}

// Found by tests/integration/hostile_client_test: a config whose duration
// had nanos out of range was accepted, and every JSON view of the job then
// failed to print it.
TEST(NormalizeJobConfigTest, RejectsMalformedDurations) {
  for (auto [seconds, nanos] : {std::make_pair<int64_t, int32_t>(0, 1000000000),
                                std::make_pair<int64_t, int32_t>(1, -1),
                                std::make_pair<int64_t, int32_t>(0, -2000000000)}) {
    v1::JobConfig in = ConfigWithId("j");
    in.mutable_hang_timeout()->set_seconds(seconds);
    in.mutable_hang_timeout()->set_nanos(nanos);
    absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << seconds << "s " << nanos << "ns";
    EXPECT_THAT(config.status().message(),
                HasSubstr("hang_timeout is not a valid google.protobuf.Duration"));
  }
}

TEST(NormalizeJobConfigTest, RejectsUnknownBackend) {
  v1::JobConfig in = ConfigWithId("j");
  in.set_backend(static_cast<v1::Backend>(42));
  absl::StatusOr<v1::JobConfig> config = NormalizeJobConfig(in);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("unknown backend"));
}

TEST(NormalizeJobConfigTest, RejectsUnknownStragglerPolicy) {
  v1::JobConfig config;
  config.set_job_id("train");
  config.set_straggler_policy(static_cast<v1::StragglerPolicy>(7));
  absl::StatusOr<v1::JobConfig> out = NormalizeJobConfig(config);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("straggler_policy"));
}

TEST(ParseStragglerPolicyTest, NamesRoundTripAndUnknownIsRefused) {
  EXPECT_EQ(*ParseStragglerPolicy(""), v1::STRAGGLER_POLICY_UNSPECIFIED);
  EXPECT_EQ(*ParseStragglerPolicy("rebalance"), v1::STRAGGLER_POLICY_REBALANCE);
  EXPECT_EQ(*ParseStragglerPolicy("Report"), v1::STRAGGLER_POLICY_REPORT);
  absl::StatusOr<v1::StragglerPolicy> bad = ParseStragglerPolicy("ignore");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("use rebalance or report"));
}

TEST(SameJobConfigTest, DistinguishesAnyDifferingField) {
  absl::StatusOr<v1::JobConfig> a = NormalizeJobConfig(ConfigWithId("j"));
  ASSERT_TRUE(a.ok());
  v1::JobConfig b = *a;
  EXPECT_TRUE(SameJobConfig(*a, b));
  b.set_max_nodes(2);
  EXPECT_FALSE(SameJobConfig(*a, b));
}

// ---------------------------------------------------------------------------
// Conversions and names

TEST(ProtoDurationTest, RoundTripsSubSecondDurations) {
  const absl::Duration d = absl::Seconds(3) + absl::Milliseconds(250);
  google::protobuf::Duration proto = ToProtoDuration(d);
  EXPECT_EQ(proto.seconds(), 3);
  EXPECT_EQ(proto.nanos(), 250000000);
  EXPECT_EQ(FromProtoDuration(proto), d);
}

TEST(ProtoDurationTest, ChecksTheDocumentedRange) {
  google::protobuf::Duration d;
  EXPECT_TRUE(CheckProtoDuration("d", d).ok());
  d.set_seconds(-3);
  d.set_nanos(-999999999);
  EXPECT_TRUE(CheckProtoDuration("d", d).ok());
  d.set_nanos(5);  // the seconds' sign differs
  EXPECT_EQ(CheckProtoDuration("d", d).code(), absl::StatusCode::kInvalidArgument);
  d.set_seconds(int64_t{315576000001});
  d.set_nanos(0);
  EXPECT_EQ(CheckProtoDuration("d", d).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProtoTimeTest, ChecksTheDocumentedRange) {
  google::protobuf::Timestamp t = ToProtoTime(absl::FromUnixSeconds(1767225600));
  EXPECT_TRUE(CheckProtoTime("t", t).ok());
  t.set_nanos(-1);
  EXPECT_EQ(CheckProtoTime("t", t).code(), absl::StatusCode::kInvalidArgument);
  t.set_nanos(0);
  t.set_seconds(int64_t{253402300800});  // year 10000
  EXPECT_THAT(CheckProtoTime("first_ready", t).message(),
              HasSubstr("first_ready is not a valid google.protobuf.Timestamp"));
}

TEST(ProtoTimeTest, RoundTripsTimestamps) {
  const absl::Time t =
      absl::FromUnixSeconds(1767225600) + absl::Microseconds(7);
  google::protobuf::Timestamp proto = ToProtoTime(t);
  EXPECT_EQ(proto.seconds(), 1767225600);
  EXPECT_EQ(proto.nanos(), 7000);
  EXPECT_EQ(FromProtoTime(proto), t);
}

TEST(NamesTest, ShortLowerCaseNames) {
  EXPECT_EQ(BackendName(v1::BACKEND_NCCL), "nccl");
  EXPECT_EQ(BackendName(v1::BACKEND_GLOO), "gloo");
  EXPECT_EQ(BackendName(v1::BACKEND_AUTO), "auto");
  EXPECT_EQ(JobStateName(v1::JOB_STATE_RUNNING), "running");
  EXPECT_EQ(MemberStateName(v1::MEMBER_STATE_SPARE), "spare");
  EXPECT_EQ(DeviceTypeName(v1::DEVICE_TYPE_CUDA), "cuda");
}

// ---------------------------------------------------------------------------
// Devices

TEST(DeviceTypeTest, ParsesTheThreeNamesAndRoundTrips) {
  for (v1::DeviceType type :
       {v1::DEVICE_TYPE_CPU, v1::DEVICE_TYPE_CUDA, v1::DEVICE_TYPE_SIM}) {
    EXPECT_EQ(ParseDeviceType(DeviceTypeName(type)).value(), type);
    EXPECT_TRUE(CheckDeviceType(type).ok()) << DeviceTypeName(type);
  }
  for (const char* name : {"", "gpu", "CUDA", "cuda:0", "tpu"}) {
    absl::StatusOr<v1::DeviceType> type = ParseDeviceType(name);
    EXPECT_EQ(type.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << name << "'";
    EXPECT_THAT(type.status().message(),
                HasSubstr("the device must be cpu, cuda or sim"));
  }
}

TEST(DeviceTypeTest, AnUnsetOrUnknownDeviceIsRefused) {
  for (int value : {0, 4, -1}) {
    absl::Status status = CheckDeviceType(static_cast<v1::DeviceType>(value));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("got DeviceType ", value)));
  }
}

// NCCL can run where the device is a GPU (a real or simulated one) and the
// backend may negotiate it; the NCCL failpoints are refused elsewhere.
TEST(DeviceTypeTest, NcclNeedsAGpuLikeDeviceAndABackendThatAllowsIt) {
  for (v1::DeviceType device : {v1::DEVICE_TYPE_CUDA, v1::DEVICE_TYPE_SIM}) {
    EXPECT_TRUE(MayRunNccl(device, v1::BACKEND_AUTO));
    EXPECT_TRUE(MayRunNccl(device, v1::BACKEND_NCCL));
    EXPECT_FALSE(MayRunNccl(device, v1::BACKEND_GLOO));
  }
  for (v1::Backend backend :
       {v1::BACKEND_AUTO, v1::BACKEND_NCCL, v1::BACKEND_GLOO}) {
    EXPECT_FALSE(MayRunNccl(v1::DEVICE_TYPE_CPU, backend));
    EXPECT_FALSE(MayRunNccl(v1::DEVICE_TYPE_UNSPECIFIED, backend));
  }
}

// ---------------------------------------------------------------------------
// ParseBackend

TEST(ParseBackendTest, ParsesTheThreeNamesCaseInsensitively) {
  EXPECT_EQ(ParseBackend("auto").value(), v1::BACKEND_AUTO);
  EXPECT_EQ(ParseBackend("gloo").value(), v1::BACKEND_GLOO);
  EXPECT_EQ(ParseBackend("nccl").value(), v1::BACKEND_NCCL);
  EXPECT_EQ(ParseBackend("NCCL").value(), v1::BACKEND_NCCL);
  EXPECT_EQ(ParseBackend("Gloo").value(), v1::BACKEND_GLOO);
}

TEST(ParseBackendTest, RejectsUnknownNames) {
  for (const char* name : {"", "mpi", "unspecified", "nccl2", " gloo"}) {
    absl::StatusOr<v1::Backend> backend = ParseBackend(name);
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << name << "'";
    EXPECT_THAT(backend.status().message(), HasSubstr("unknown backend"))
        << "'" << name << "'";
  }
}

TEST(ParseBackendTest, RoundTripsWithBackendName) {
  for (v1::Backend b : {v1::BACKEND_AUTO, v1::BACKEND_GLOO, v1::BACKEND_NCCL}) {
    EXPECT_EQ(ParseBackend(BackendName(b)).value(), b);
  }
}

}  // namespace
}  // namespace gradsync
