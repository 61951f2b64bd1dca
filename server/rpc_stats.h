// Counts and latencies of the coordinator's RPCs, collected by a gRPC server
// interceptor into prometheus-cpp metrics.
#ifndef GRADSYNC_SERVER_RPC_STATS_H_
#define GRADSYNC_SERVER_RPC_STATS_H_

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

// Families: gradsync_rpc_requests_total{method,code},
// gradsync_rpc_messages_received_total{method} and
// gradsync_rpc_latency_seconds{method} (unary calls only).
//
// Thread-safe. A call's metrics are found once, when its interceptor is
// created; recording a message is one atomic add, a finish one more and,
// for unary calls, one histogram observation (prometheus-cpp takes that
// histogram's mutex). Must outlive the server whose interceptor it feeds.
class RpcStats {
 public:
  // Upper bounds (seconds) of the unary latency histogram's buckets.
  static constexpr std::array<double, 14> kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,  0.5,    1,     2.5,  5,     10};

  // The metrics of one method ("/gradsync.v1.Jobs/GetJob").
  struct Method {
    std::string name;
    prometheus::Counter* messages_received = nullptr;
    // Unary methods only; null for streams.
    prometheus::Histogram* latency = nullptr;
    // Finished calls by gRPC status code, each created on first use (so
    // that codes never seen export no series).
    std::array<std::atomic<prometheus::Counter*>, 17> finished{};
  };

  RpcStats();

  // The entry of `name`, created on first use; the pointer stays valid for
  // the life of the RpcStats.
  Method* ForMethod(absl::string_view name, bool unary);

  // Records one finished call with gRPC status `code`.
  void RecordFinish(Method* method, int code, absl::Duration latency);

  // The three families as they are now.
  std::vector<prometheus::MetricFamily> Collect() const;

  // A factory for ServerBuilder::experimental().SetInterceptorCreators that
  // records every call into this RpcStats.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory();

 private:
  prometheus::Registry registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& messages_;
  prometheus::Family<prometheus::Histogram>& latency_;

  mutable absl::Mutex mu_;
  absl::node_hash_map<std::string, Method> methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_RPC_STATS_H_
