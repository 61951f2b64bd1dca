#include "server/rpc_stats.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gradsync {
namespace {

using grpc::experimental::InterceptionHookPoints;

// One per call. Latency is measured with the real clock: it is an
// observation of real RPCs, not an input to any decision.
class StatsInterceptor final : public grpc::experimental::Interceptor {
 public:
  StatsInterceptor(RpcStats* stats, RpcStats::Method* method)
      : stats_(stats), method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE)) {
      method_->messages_received->Increment();
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      stats_->RecordFinish(method_, methods->GetSendStatus().error_code(),
                           absl::Now() - start_);
    }
    methods->Proceed();
  }

 private:
  RpcStats* const stats_;
  RpcStats::Method* const method_;
  const absl::Time start_ = absl::Now();
};

class StatsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit StatsInterceptorFactory(RpcStats* stats) : stats_(stats) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new StatsInterceptor(stats_, stats_->ForMethod(
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

RpcStats::RpcStats()
    : requests_(prometheus::BuildCounter()
                    .Name("gradsync_rpc_requests_total")
                    .Help("Finished RPCs by method and gRPC status code.")
                    .Register(registry_)),
      messages_(prometheus::BuildCounter()
                    .Name("gradsync_rpc_messages_received_total")
                    .Help("Request messages received by method (heartbeats "
                          "included).")
                    .Register(registry_)),
      latency_(prometheus::BuildHistogram()
                   .Name("gradsync_rpc_latency_seconds")
                   .Help("Latency of unary RPCs, from arrival to status.")
                   .Register(registry_)) {}

RpcStats::Method* RpcStats::ForMethod(absl::string_view name, bool unary) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = methods_.try_emplace(name);
  Method& method = it->second;
  if (inserted) {
    method.name = std::string(name);
    method.messages_received = &messages_.Add({{"method", method.name}});
    if (unary) {
      method.latency = &latency_.Add(
          {{"method", method.name}},
          prometheus::Histogram::BucketBoundaries(kBuckets.begin(),
                                                  kBuckets.end()));
    }
  }
  return &method;
}

void RpcStats::RecordFinish(Method* method, int code, absl::Duration latency) {
  if (code >= 0 && code < static_cast<int>(method->finished.size())) {
    prometheus::Counter* counter =
        method->finished[code].load(std::memory_order_acquire);
    if (counter == nullptr) {
      // Add() returns the same counter to threads racing here.
      counter = &requests_.Add({{"method", method->name}, {"code", CodeName(code)}});
      method->finished[code].store(counter, std::memory_order_release);
    }
    counter->Increment();
  }
  if (method->latency != nullptr) {
    method->latency->Observe(absl::ToDoubleSeconds(latency));
  }
}

std::vector<prometheus::MetricFamily> RpcStats::Collect() const {
  return registry_.Collect();
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcStats::NewInterceptorFactory() {
  return std::make_unique<StatsInterceptorFactory>(this);
}

}  // namespace gradsync
