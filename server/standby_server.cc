#include "server/standby_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/host_ports.h"

namespace gradsync {
namespace {

// One call: requested, then finished with the answer.
struct StandbyCall {
  grpc::GenericServerContext context;
  grpc::GenericServerAsyncReaderWriter stream{&context};
  bool finishing = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const std::string& listen_address,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  std::unique_ptr<StandbyServer> standby(new StandbyServer());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      listen_address,
      credentials != nullptr ? credentials : grpc::InsecureServerCredentials(),
      &standby->port_);
  builder.RegisterAsyncGenericService(&standby->service_);
  standby->queue_ = builder.AddCompletionQueue();
  standby->server_ = builder.BuildAndStart();
  if (standby->server_ == nullptr || standby->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", listen_address,
        "' while standing by: the address is in use or not local"));
  }
  standby->thread_ = std::thread([s = standby.get()] { s->Serve(); });
  return standby;
}

StandbyServer::~StandbyServer() {
  server_->Shutdown(std::chrono::system_clock::now());
  {
    absl::MutexLock lock(&mu_);
    queue_closed_ = true;
    queue_->Shutdown();
  }
  thread_.join();
}

void StandbyServer::SetLeader(const std::string& address) {
  absl::MutexLock lock(&mu_);
  leader_ = address;
}

bool StandbyServer::RequestCall(void* tag) {
  absl::MutexLock lock(&mu_);
  if (queue_closed_) return false;
  auto* call = static_cast<StandbyCall*>(tag);
  service_.RequestCall(&call->context, &call->stream, queue_.get(),
                       queue_.get(), call);
  return true;
}

void StandbyServer::Serve() {
  auto* next = new StandbyCall();
  if (!RequestCall(next)) delete next;
  void* tag = nullptr;
  bool ok = false;
  while (queue_->Next(&tag, &ok)) {
    auto* call = static_cast<StandbyCall*>(tag);
    if (call->finishing || !ok) {
      delete call;
      continue;
    }
    auto* another = new StandbyCall();
    if (!RequestCall(another)) delete another;
    std::string leader;
    {
      absl::MutexLock lock(&mu_);
      leader = leader_;
    }
    std::string message = "this coordinator replica stands by";
    if (leader.empty()) {
      absl::StrAppend(&message, "; no replica leads yet");
    } else {
      absl::StrAppend(&message, "; the leader is at ", leader);
      call->context.AddTrailingMetadata(kLeaderMetadataKey, leader);
    }
    call->finishing = true;
    absl::MutexLock lock(&mu_);
    if (queue_closed_) {
      delete call;
      continue;
    }
    call->stream.Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, message),
                        call);
  }
}

}  // namespace gradsync
