// InProcessServer: gRPC services served on a free loopback port of this
// process, for tests of one service (or of a client against scripted
// services) without a coordinator.
//
//   ScriptedKv kv;
//   InProcessServer server({&kv});
//   auto stub = v1::KeyValue::NewStub(server.Channel());
//
// The services must outlive the server; the destructor shuts it down
// (waiting for calls in flight).
#ifndef GRADSYNC_TESTS_TESTING_IN_PROCESS_SERVER_H_
#define GRADSYNC_TESTS_TESTING_IN_PROCESS_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradsync {

class InProcessServer {
 public:
  explicit InProcessServer(const std::vector<grpc::Service*>& services) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    for (grpc::Service* service : services) builder.RegisterService(service);
    server_ = builder.BuildAndStart();
  }
  ~InProcessServer() {
    if (server_ != nullptr) server_->Shutdown();
  }
  InProcessServer(const InProcessServer&) = delete;
  InProcessServer& operator=(const InProcessServer&) = delete;

  // Whether it serves (a port was bound).
  bool ok() const { return server_ != nullptr && port_ > 0; }
  // "127.0.0.1:PORT".
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // A plaintext channel to it.
  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_IN_PROCESS_SERVER_H_
