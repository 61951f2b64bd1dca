// Bytes that do not parse as a method's request are answered
// INVALID_ARGUMENT naming the method and the request type, on every method
// of every gradsync service, whichever gRPC API serves it (callback,
// asynchronous unary, asynchronous streams), and the coordinator serves
// well-formed calls afterwards.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/health.grpc.pb.h"
#include "proto/gradsync/v1/jobs.grpc.pb.h"
#include "proto/gradsync/v1/kv.grpc.pb.h"
#include "proto/gradsync/v1/rendezvous.grpc.pb.h"
#include "server/coordinator.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// A field tag whose varint never ends: no message parses from it.
const char kUndecodable[] = "\xff\xff\xff\xff";

struct Method {
  std::string path;          // "/gradsync.v1.Service/Method"
  std::string request_type;  // "gradsync.v1.SomeRequest"
};

// Every method of the gradsync services, from the generated descriptors.
std::vector<Method> AllMethods() {
  std::vector<Method> methods;
  for (const char* name : {"gradsync.v1.Rendezvous", "gradsync.v1.KeyValue",
                           "gradsync.v1.Jobs", "gradsync.v1.Monitor"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            name);
    EXPECT_NE(service, nullptr) << name;
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* method = service->method(i);
      methods.push_back({absl::StrCat("/", name, "/", method->name()),
                         method->input_type()->full_name()});
    }
  }
  return methods;
}

class MalformedRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorConfig config;
    config.listen_address = "127.0.0.1:0";
    config.completion_queues = 2;
    coordinator_ = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator_->Start().ok());
    channel_ = grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", coordinator_->port()),
        grpc::InsecureChannelCredentials());
  }
  void TearDown() override { coordinator_->Shutdown(); }

  // Sends `bytes` as the one request message of `method` (a stream's too)
  // and returns the call's status.
  grpc::Status Call(const std::string& method, const std::string& bytes) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    return status;
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(MalformedRequestTest, EveryMethodNamesItselfAndItsRequestType) {
  const std::vector<Method> methods = AllMethods();
  ASSERT_EQ(methods.size(), 17u);  // every rpc in proto/gradsync/v1
  for (const Method& method : methods) {
    SCOPED_TRACE(method.path);
    const grpc::Status status = Call(method.path, kUndecodable);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(method.path));
    EXPECT_THAT(status.error_message(), HasSubstr(method.request_type));
  }
}

TEST_F(MalformedRequestTest, WellFormedCallsAreServedAfterward) {
  for (const Method& method : AllMethods()) {
    (void)Call(method.path, kUndecodable);
  }
  v1::GetJobRequest request;
  request.set_job_id("no-such-job");
  const grpc::Status status =
      Call("/gradsync.v1.Jobs/GetJob", request.SerializeAsString());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
      << status.error_message();
}

}  // namespace
}  // namespace gradsync
