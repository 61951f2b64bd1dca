// What a heartbeat stream held back costs the coordinator: a client that
// sends faster than it was asked is read no faster than the policer allows
// (HeartbeatPolicer), and the rest of what it writes waits in the
// coordinator's transport, up to the stream's HTTP/2 receive window, before
// flow control stops the client. Measured as the bytes the clients could
// write before every write stalled (what the coordinator read, a burst of
// about 9 messages a stream, plus what its transport and the kernel took
// in). With receive windows kept at HTTP/2's 64 KiB
// (CoordinatorConfig::grow_receive_windows = false) a held stream costs
// about 0.2 MiB; grown by gRPC's BDP probe (the default), about 4.3 MiB,
// and more with many streams, unless the transport's memory is limited
// (CoordinatorConfig::transport_memory_limit): then all held streams
// together cost about twice the limit plus the kernel's socket buffers
// (gRPC ends streams past it), and the coordinator still serves others.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "gtest/gtest.h"
#include "proto/gradsync/v1/health.grpc.pb.h"
#include "server/coordinator.h"
#include "worker/client/grpc_coordinator_client.h"

namespace gradsync {
namespace {

constexpr int kPaddingBytes = 16 << 10;

using Stream =
    grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>;

struct Held {
  // Bytes the streams could write before all of them stalled; -1 when the
  // job could not be joined.
  int64_t bytes = -1;
  // A key-value Set and Get of kValueBytes by another client, while held.
  absl::Status set;
  absl::StatusOr<std::string> got;
};

constexpr int kValueBytes = 256 << 10;

// `count` heartbeat streams of members asked for one heartbeat a minute,
// each writing as fast as it can until all of them stalled.
Held HoldStreams(const CoordinatorConfig& config, int count) {
  Held held;
  Coordinator coordinator(config);
  EXPECT_TRUE(coordinator.Start().ok());
  const std::string address = absl::StrCat("127.0.0.1:", coordinator.port());
  ClientOptions options;
  options.target = address;
  std::unique_ptr<CoordinatorClient> client =
      *GrpcCoordinatorClient::Create(options);
  v1::JoinNodeRequest join;
  join.set_job_id("held");
  join.mutable_config()->set_job_id("held");
  join.mutable_config()->set_min_nodes(1);
  join.mutable_config()->set_nproc_per_node(count);
  *join.mutable_config()->mutable_heartbeat_interval() =
      ToProtoDuration(absl::Minutes(1));
  for (int i = 0; i < count; ++i) {
    *join.add_processes()->mutable_node() = LocalNodeDescriptor();
  }
  absl::StatusOr<std::vector<v1::Assignment>> assigned = client->JoinNode(join);
  EXPECT_TRUE(assigned.ok()) << assigned.status();
  if (!assigned.ok()) return held;

  std::unique_ptr<v1::Monitor::Stub> stub = v1::Monitor::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::thread> threads;
  std::atomic<int64_t> written{0};
  for (int i = 0; i < count; ++i) {
    v1::HeartbeatRequest heartbeat;
    v1::MemberRef* member = heartbeat.mutable_member();
    member->set_job_id("held");
    member->set_round((*assigned)[i].round());
    member->set_rank((*assigned)[i].rank());
    member->set_incarnation_id(join.processes(i).node().incarnation_id());
    // Bulk the coordinator parses and drops (an unknown field).
    heartbeat.GetReflection()->MutableUnknownFields(&heartbeat)
        ->AddLengthDelimited(1000, std::string(kPaddingBytes, 'x'));
    const int64_t size = static_cast<int64_t>(heartbeat.ByteSizeLong());
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    // Bounds the readers' last Read: one was seen blocked past TryCancel
    // on a stream the limit's reclamation had ended.
    contexts.back()->set_deadline(std::chrono::system_clock::now() +
                                  std::chrono::seconds(90));
    streams.push_back(stub->Heartbeat(contexts.back().get()));
    Stream* stream = streams.back().get();
    threads.emplace_back([stream, heartbeat, size, &written] {
      while (stream->Write(heartbeat)) written += size;
    });
    threads.emplace_back([stream] {
      v1::HeartbeatResponse answer;
      while (stream->Read(&answer)) {
      }
    });
  }
  // Stalled: nothing more written for 2 s (a pause of the writers on a
  // loaded machine only counts fewer bytes).
  int64_t last = -1;
  absl::Time changed = absl::Now();
  const absl::Time bound = absl::Now() + absl::Seconds(30);
  while (absl::Now() < bound && absl::Now() - changed < absl::Seconds(2)) {
    absl::SleepFor(absl::Milliseconds(50));
    if (written.load() != last) {
      last = written.load();
      changed = absl::Now();
    }
  }
  held.bytes = last;
  v1::Scope scope;
  scope.set_job_id("held");
  scope.set_round((*assigned)[0].round());
  held.set = client->Set(scope, "while-held", std::string(kValueBytes, 'v'));
  held.got = client->Get(scope, "while-held");
  for (auto& context : contexts) context->TryCancel();
  for (auto& thread : threads) thread.join();
  coordinator.Shutdown();
  return held;
}

void ExpectServedWhileHeld(const Held& held) {
  EXPECT_TRUE(held.set.ok()) << held.set;
  ASSERT_TRUE(held.got.ok()) << held.got.status();
  EXPECT_EQ(held.got->size(), kValueBytes);
}

TEST(HeldStreamTest, WithWindowsNotGrownAHeldStreamBuffersLittle) {
  CoordinatorConfig config;
  config.listen_address = "127.0.0.1:0";
  config.grow_receive_windows = false;
  constexpr int kStreams = 10;
  const Held held = HoldStreams(config, kStreams);
  ASSERT_GT(held.bytes, 0);
  // 9 messages read and a 64 KiB window, a stream: about 0.2 MiB.
  EXPECT_LE(held.bytes / kStreams, 512 << 10)
      << held.bytes << " bytes written on " << kStreams << " held streams";
  ExpectServedWhileHeld(held);
}

TEST(HeldStreamTest, UnderATransportMemoryLimitHeldStreamsTogetherBufferAboutIt) {
  CoordinatorConfig config;
  config.listen_address = "127.0.0.1:0";
  config.transport_memory_limit = 16 << 20;
  // Without the limit these streams buffer 4-11 MiB each (181-443 MB in
  // all, measured); with it, 35-55 MB: about twice the limit (gRPC shrinks
  // the windows near it and, past it, ends streams and sends idle
  // connections away) plus the kernel's socket buffers of the connection.
  constexpr int kStreams = 40;
  const Held held = HoldStreams(config, kStreams);
  ASSERT_GT(held.bytes, 0);
  EXPECT_LE(held.bytes, 96 << 20)
      << held.bytes << " bytes written on " << kStreams << " held streams";
  ExpectServedWhileHeld(held);
}

}  // namespace
}  // namespace gradsync
