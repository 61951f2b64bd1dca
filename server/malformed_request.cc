#include "server/malformed_request.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/descriptor.h"

namespace gradsync {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

// The request type of "/package.Service/Method", from the generated pool;
// empty when no such method is compiled in.
std::string RequestType(absl::string_view method) {
  absl::string_view name = method;
  if (!name.empty() && name.front() == '/') name.remove_prefix(1);
  const google::protobuf::MethodDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
          absl::StrReplaceAll(name, {{"/", "."}}));
  return descriptor == nullptr ? std::string()
                               : descriptor->input_type()->full_name();
}

// One per call of a method with one request message (unary or server
// streaming): notes whether the request parsed, and if not, replaces the
// call's final status.
class MalformedRequestInterceptor final
    : public grpc::experimental::Interceptor {
 public:
  explicit MalformedRequestInterceptor(const char* method) : method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // No message where one was due: its bytes did not parse (a client that
    // sends none gets the same answer; a unary call needs one).
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      malformed_ = true;
    }
    if (malformed_ && methods->QueryInterceptionHookPoint(
                          InterceptionHookPoints::PRE_SEND_STATUS)) {
      methods->ModifySendStatus(MalformedRequest(method_));
    }
    methods->Proceed();
  }

 private:
  const char* const method_;
  bool malformed_ = false;
};

class MalformedRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      ServerRpcInfo* info) override {
    if (info->type() != ServerRpcInfo::Type::UNARY &&
        info->type() != ServerRpcInfo::Type::SERVER_STREAMING) {
      return nullptr;
    }
    return new MalformedRequestInterceptor(info->method());
  }
};

}  // namespace

grpc::Status MalformedRequest(absl::string_view method) {
  const std::string type = RequestType(method);
  return grpc::Status(
      grpc::StatusCode::INVALID_ARGUMENT,
      absl::StrCat("the request to ", method, " is not a valid ",
                   type.empty() ? "request" : type,
                   " message (its bytes do not parse)"));
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewMalformedRequestInterceptorFactory() {
  return std::make_unique<MalformedRequestInterceptorFactory>();
}

}  // namespace gradsync
