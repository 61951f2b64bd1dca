// Counts and latencies of the coordinator's RPCs, collected by a gRPC server
// interceptor and rendered as Prometheus metrics.
#ifndef GRADSYNC_SERVER_RPC_STATS_H_
#define GRADSYNC_SERVER_RPC_STATS_H_

#include <grpcpp/support/server_interceptor.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/prometheus_text.h"

namespace gradsync {

// Thread-safe; recording a call or message takes no lock (one lookup per
// call, when its interceptor is created). Must outlive the server whose
// interceptor it feeds.
class RpcStats {
 public:
  // Upper bounds (seconds) of the unary latency histogram's buckets.
  static constexpr std::array<double, 14> kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,  0.5,    1,     2.5,  5,     10};

  // The statistics of one method ("/gradsync.v1.Jobs/GetJob").
  struct Method {
    bool unary = false;
    std::atomic<int64_t> messages_received{0};
    // Finished calls by gRPC status code.
    std::array<std::atomic<int64_t>, 17> finished{};
    // Unary calls only: latency histogram (not cumulative) and sum.
    std::array<std::atomic<int64_t>, kBuckets.size() + 1> latency{};
    std::atomic<int64_t> latency_sum_ns{0};
  };

  // The entry of `name`, created on first use; the pointer stays valid for
  // the life of the RpcStats.
  Method* ForMethod(absl::string_view name, bool unary);

  // Records one finished call.
  static void RecordFinish(Method* method, int code, absl::Duration latency);

  // Appends gradsync_rpc_requests_total, gradsync_rpc_messages_received_total
  // and gradsync_rpc_latency_seconds.
  void Render(PrometheusText* out) const;

  // A factory for ServerBuilder::experimental().SetInterceptorCreators that
  // records every call into this RpcStats.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory();

 private:
  mutable absl::Mutex mu_;
  absl::node_hash_map<std::string, Method> methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_RPC_STATS_H_
