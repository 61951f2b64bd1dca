// RpcStats: what the interceptor records comes out as prometheus-cpp
// families with the names, labels and buckets /metrics shows.
#include "server/rpc_stats.h"

#include <prometheus/text_serializer.h>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RpcStatsTest, UnaryCallsCountByCodeWithLatency) {
  RpcStats stats;
  RpcStats::Method* get = stats.ForMethod("/gradsync.v1.KeyValue/Get", true);
  EXPECT_EQ(stats.ForMethod("/gradsync.v1.KeyValue/Get", true), get);
  get->messages_received->Increment();
  stats.RecordFinish(get, 0, absl::Milliseconds(3));
  stats.RecordFinish(get, 0, absl::Milliseconds(20));
  stats.RecordFinish(get, 5, absl::Seconds(30));
  const std::string text = prometheus::TextSerializer().Serialize(stats.Collect());
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_requests_total{code=\"OK\",method=\"/gradsync.v1.KeyValue/Get\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_requests_total{code=\"NOT_FOUND\",method=\"/gradsync.v1.KeyValue/Get\"} 1\n"));
  // Codes never seen export no series.
  EXPECT_THAT(text, Not(HasSubstr("code=\"INTERNAL\"")));
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_messages_received_total{method=\"/gradsync.v1.KeyValue/Get\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_latency_seconds_count{method=\"/gradsync.v1.KeyValue/Get\"} 3\n"));
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_latency_seconds_bucket{method=\"/gradsync.v1.KeyValue/Get\",le=\"0.005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_latency_seconds_bucket{method=\"/gradsync.v1.KeyValue/Get\",le=\"0.025\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_latency_seconds_bucket{method=\"/gradsync.v1.KeyValue/Get\",le=\"10\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_latency_seconds_bucket{method=\"/gradsync.v1.KeyValue/Get\",le=\"+Inf\"} 3\n"));
}

TEST(RpcStatsTest, StreamsHaveNoLatencyHistogram) {
  RpcStats stats;
  RpcStats::Method* beats = stats.ForMethod("/gradsync.v1.Monitor/NodeHeartbeat", false);
  for (int i = 0; i < 4; ++i) beats->messages_received->Increment();
  stats.RecordFinish(beats, 1, absl::Minutes(10));
  stats.RecordFinish(beats, 99, absl::Seconds(1));  // no such code: ignored
  const std::string text = prometheus::TextSerializer().Serialize(stats.Collect());
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_messages_received_total{method=\"/gradsync.v1.Monitor/NodeHeartbeat\"} 4\n"));
  EXPECT_THAT(text, HasSubstr(
      "gradsync_rpc_requests_total{code=\"CANCELLED\",method=\"/gradsync.v1.Monitor/NodeHeartbeat\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("gradsync_rpc_latency_seconds_count")));
  EXPECT_THAT(text, Not(HasSubstr("code=\"99\"")));
}

}  // namespace
}  // namespace gradsync
