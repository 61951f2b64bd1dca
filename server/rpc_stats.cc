#include "server/rpc_stats.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gradsync {
namespace {

using grpc::experimental::InterceptionHookPoints;

// One per call. Latency is measured with the real clock: it is an
// observation of real RPCs, not an input to any decision.
class StatsInterceptor final : public grpc::experimental::Interceptor {
 public:
  StatsInterceptor(RpcStats::Method* method) : method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE)) {
      method_->messages_received.fetch_add(1, std::memory_order_relaxed);
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      RpcStats::RecordFinish(method_, methods->GetSendStatus().error_code(),
                             absl::Now() - start_);
    }
    methods->Proceed();
  }

 private:
  RpcStats::Method* const method_;
  const absl::Time start_ = absl::Now();
};

class StatsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit StatsInterceptorFactory(RpcStats* stats) : stats_(stats) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new StatsInterceptor(stats_->ForMethod(
        info->method(),
        info->type() == grpc::experimental::ServerRpcInfo::Type::UNARY));
  }

 private:
  RpcStats* const stats_;
};

std::string CodeName(int code) {
  static const char* const kNames[] = {
      "OK",           "CANCELLED",          "UNKNOWN",
      "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "ABORTED",     "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",          "UNAVAILABLE",
      "DATA_LOSS",    "UNAUTHENTICATED"};
  return code >= 0 && code < 17 ? kNames[code] : absl::StrCat(code);
}

}  // namespace

RpcStats::Method* RpcStats::ForMethod(absl::string_view name, bool unary) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = methods_.try_emplace(name);
  if (inserted) it->second.unary = unary;
  return &it->second;
}

void RpcStats::RecordFinish(Method* method, int code, absl::Duration latency) {
  if (code >= 0 && code < static_cast<int>(method->finished.size())) {
    method->finished[code].fetch_add(1, std::memory_order_relaxed);
  }
  if (!method->unary) return;
  const double seconds = absl::ToDoubleSeconds(latency);
  const size_t bucket =
      std::lower_bound(kBuckets.begin(), kBuckets.end(), seconds) -
      kBuckets.begin();
  method->latency[bucket].fetch_add(1, std::memory_order_relaxed);
  method->latency_sum_ns.fetch_add(absl::ToInt64Nanoseconds(latency),
                                   std::memory_order_relaxed);
}

void RpcStats::Render(PrometheusText* out) const {
  absl::MutexLock lock(&mu_);
  // Sorted for a stable output.
  std::map<absl::string_view, const Method*> sorted;
  for (const auto& [name, method] : methods_) sorted[name] = &method;

  out->Family("gradsync_rpc_requests_total", "counter",
              "Finished RPCs by method and gRPC status code.");
  for (const auto& [name, method] : sorted) {
    for (size_t code = 0; code < method->finished.size(); ++code) {
      const int64_t n = method->finished[code].load();
      if (n == 0) continue;
      const std::string code_name = CodeName(static_cast<int>(code));
      out->Sample("gradsync_rpc_requests_total",
                  {{"method", name}, {"code", code_name}}, n);
    }
  }
  out->Family("gradsync_rpc_messages_received_total", "counter",
              "Request messages received by method (heartbeats included).");
  for (const auto& [name, method] : sorted) {
    out->Sample("gradsync_rpc_messages_received_total", {{"method", name}},
                method->messages_received.load());
  }
  out->Family("gradsync_rpc_latency_seconds", "histogram",
              "Latency of unary RPCs, from arrival to status.");
  for (const auto& [name, method] : sorted) {
    if (!method->unary) continue;
    int64_t cumulative = 0;
    for (size_t b = 0; b <= kBuckets.size(); ++b) {
      cumulative += method->latency[b].load();
      const std::string le =
          b < kBuckets.size() ? absl::StrCat(kBuckets[b]) : "+Inf";
      out->Sample("gradsync_rpc_latency_seconds_bucket",
                  {{"method", name}, {"le", le}}, cumulative);
    }
    out->Sample("gradsync_rpc_latency_seconds_sum", {{"method", name}},
                method->latency_sum_ns.load() / 1e9);
    out->Sample("gradsync_rpc_latency_seconds_count", {{"method", name}},
                cumulative);
  }
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcStats::NewInterceptorFactory() {
  return std::make_unique<StatsInterceptorFactory>(this);
}

}  // namespace gradsync
