// DDP's broadcast_buffers: rank 0's module buffers (BatchNorm statistics and
// counters) copied to every rank before each forward. gradsync's
// BroadcastTensors (coalesced: one broadcast per dtype) against one
// broadcast per buffer, what gradsync's DDP did until 2026-11-30, over Gloo
// (TCP loopback) and shared memory, ranks as threads of this process; the
// buffers of the model gradsync-worker trains (--model). The two alternate
// run by run so that machine noise hits both. bench/
// buffer_broadcast_bench.sh runs PyTorch's own beside it. Every run starts
// with rank r's buffers holding r and checks that they hold 0 after.
//
//   bazel run -c opt //bench:buffer_broadcast_bench -- --model=resnet50
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "worker/backend/gloo_backend.h"
#include "worker/backend/shm_backend.h"
#include "worker/backend/store.h"
#include "worker/ddp/tensor_broadcast.h"
#include "worker/trainer/models.h"

ABSL_FLAG(int, world_size, 2, "ranks (threads)");
ABSL_FLAG(std::string, model, "resnet50", "a model with buffers: cnn_bn, resnet18 or resnet50");
ABSL_FLAG(int, iterations, 50, "measured runs of each kind");
ABSL_FLAG(int, warmup, 5, "unmeasured runs of each kind first");
ABSL_FLAG(std::string, backend, "gloo,shm", "gloo, shm or both, comma-separated");

namespace gradsync {
namespace {

constexpr absl::Duration kTimeout = absl::Minutes(2);

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::unique_ptr<Backend> MakeBackend(const std::string& kind,
                                     const BackendOptions& options,
                                     Store* store) {
  if (kind == "gloo") {
    auto backend = GlooBackend::Create(options, store);
    GS_CHECK(backend.ok()) << backend.status();
    return std::move(*backend);
  }
  GS_CHECK(kind == "shm") << "--backend: expected gloo or shm, got " << kind;
  auto backend = ShmBackend::Create(options, store, ShmOptions());
  GS_CHECK(backend.ok()) << backend.status();
  return std::move(*backend);
}

// One backend's medians on one rank, and the elements left wrong.
struct Timings {
  std::vector<double> per_buffer_ms, coalesced_ms;
  int64_t wrong = 0;
};

void RunRank(int rank, const std::vector<std::string>& kinds,
             std::deque<InMemoryStore>* stores,
             const std::vector<torch::Tensor>& shapes,
             std::vector<Timings>* out) {
  BackendOptions options;
  options.rank = rank;
  options.world_size = absl::GetFlag(FLAGS_world_size);
  options.timeout = kTimeout;
  std::vector<torch::Tensor> buffers;
  for (const torch::Tensor& t : shapes) buffers.push_back(torch::empty_like(t));
  for (size_t k = 0; k < kinds.size(); ++k) {
    std::unique_ptr<Backend> backend =
        MakeBackend(kinds[k], options, &(*stores)[k]);
    auto timed = [&](bool coalesced) {
      for (torch::Tensor& b : buffers) b.fill_(rank);
      GS_CHECK(backend->Barrier()->Wait(kTimeout).ok());
      const absl::Time start = absl::Now();
      if (coalesced) {
        GS_CHECK(BroadcastTensors(backend.get(), buffers, kTimeout).ok());
      } else {
        for (const torch::Tensor& b : buffers) {
          GS_CHECK(BroadcastTensors(backend.get(), {b}, kTimeout).ok());
        }
      }
      const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      for (const torch::Tensor& b : buffers) {
        (*out)[k].wrong += b.ne(0).sum().item<int64_t>();
      }
      return ms;
    };
    const int warmup = absl::GetFlag(FLAGS_warmup);
    for (int i = 0; i < warmup + absl::GetFlag(FLAGS_iterations); ++i) {
      const bool coalesced_first = i % 2 == 0;
      const double first = timed(coalesced_first);
      const double second = timed(!coalesced_first);
      if (i < warmup) continue;
      (*out)[k].coalesced_ms.push_back(coalesced_first ? first : second);
      (*out)[k].per_buffer_ms.push_back(coalesced_first ? second : first);
    }
  }
}

int Main() {
  torch::manual_seed(0);
  auto model = MakeModel({absl::GetFlag(FLAGS_model), 128});
  GS_CHECK(model.ok()) << model.status();
  std::vector<torch::Tensor> shapes = (*model)->buffers();
  GS_CHECK(!shapes.empty()) << absl::GetFlag(FLAGS_model) << " has no buffers";
  int64_t bytes = 0;
  for (const torch::Tensor& t : shapes) bytes += t.numel() * t.element_size();
  const int world_size = absl::GetFlag(FLAGS_world_size);
  const std::vector<std::string> kinds =
      absl::StrSplit(absl::GetFlag(FLAGS_backend), ',', absl::SkipEmpty());
  std::deque<InMemoryStore> stores(kinds.size());
  std::vector<std::vector<Timings>> timings(world_size,
                                            std::vector<Timings>(kinds.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back(RunRank, r, std::cref(kinds), &stores,
                         std::cref(shapes), &timings[r]);
  }
  for (std::thread& t : threads) t.join();
  std::printf("%s: %zu buffers, %lld bytes, %d ranks\n",
              absl::GetFlag(FLAGS_model).c_str(), shapes.size(),
              static_cast<long long>(bytes), world_size);
  for (size_t k = 0; k < kinds.size(); ++k) {
    int64_t wrong = 0;
    for (int r = 0; r < world_size; ++r) wrong += timings[r][k].wrong;
    const double per_buffer = Median(timings[0][k].per_buffer_ms);
    const double coalesced = Median(timings[0][k].coalesced_ms);
    std::printf(
        "RESULT backend=%s buffers=%zu bytes=%lld per_buffer_ms=%.3f "
        "coalesced_ms=%.3f coalesced_over_per_buffer=%.3f wrong=%lld\n",
        kinds[k].c_str(), shapes.size(), static_cast<long long>(bytes),
        per_buffer, coalesced, coalesced / per_buffer,
        static_cast<long long>(wrong));
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gradsync::Main();
}
