// Bucketed gradient sync against a raw all-reduce of the same bytes, on the
// Gloo backend with ranks as threads of this process: the buckets are the
// ones DistributedDataParallel's reducer forms for the model (first bucket
// --first_bucket_mb, then --bucket_cap_mb), all-reduced back to back as the
// reducer issues them; the raw all-reduce moves the whole gradient in one
// call. Runs alternate between the two so that machine noise hits both.
// Bandwidths as nccl-tests reports them: algbw = bytes / time, busbw =
// algbw * 2 (W - 1) / W.
//
//   bazel run -c opt //bench:allreduce_bench -- --hidden=2800 --world_size=2
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "worker/backend/gloo_backend.h"
#include "worker/backend/store.h"
#include "worker/ddp/reducer.h"
#include "worker/trainer/models.h"

ABSL_FLAG(int, world_size, 2, "ranks (threads)");
ABSL_FLAG(std::string, model, "mlp", "mlp or cnn");
ABSL_FLAG(int, hidden, 2800, "hidden width (2800: a 10M-parameter MLP)");
ABSL_FLAG(double, first_bucket_mb, 1.0, "first bucket cap, MiB");
ABSL_FLAG(double, bucket_cap_mb, 25.0, "bucket cap, MiB");
ABSL_FLAG(int, iterations, 20, "measured runs of each kind");
ABSL_FLAG(int, warmup, 3, "unmeasured runs of each kind first");

namespace gradsync {
namespace {

struct Timings {
  std::vector<double> raw_ms;
  std::vector<double> bucketed_ms;
};

// A benchmark has no one to return errors to: it stops with the message.
void CheckOk(const absl::Status& status) { GS_CHECK(status.ok()) << status; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One rank: a full gradient buffer and one buffer per bucket.
void RunRank(int rank, int world_size, InMemoryStore* store,
             const std::vector<int64_t>& bucket_elements, Timings* out) {
  BackendOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.timeout = absl::Minutes(2);
  auto backend = GlooBackend::Create(options, store);
  GS_CHECK(backend.ok()) << backend.status();
  int64_t total = 0;
  for (int64_t n : bucket_elements) total += n;
  std::vector<float> flat(total, 1.0f);
  std::vector<std::vector<float>> buckets;
  for (int64_t n : bucket_elements) buckets.emplace_back(n, 1.0f);

  auto raw = [&] {
    Buffer buffer{flat.data(), flat.size()};
    CheckOk((*backend)->AllReduce(buffer, ReduceOp::kAverage)->Wait(
        options.timeout));
  };
  auto bucketed = [&] {
    std::vector<std::shared_ptr<Work>> works;
    for (auto& b : buckets) {
      works.push_back(
          (*backend)->AllReduce(Buffer{b.data(), b.size()}, ReduceOp::kAverage));
    }
    for (auto& w : works) CheckOk(w->Wait(options.timeout));
  };
  auto timed = [&](auto&& fn) {
    CheckOk((*backend)->Barrier()->Wait(options.timeout));
    const absl::Time start = absl::Now();
    fn();
    return absl::ToDoubleMilliseconds(absl::Now() - start);
  };
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  for (int i = 0; i < warmup + iterations; ++i) {
    // Alternate which kind goes first.
    double r, b;
    if (i % 2 == 0) {
      r = timed(raw);
      b = timed(bucketed);
    } else {
      b = timed(bucketed);
      r = timed(raw);
    }
    if (i >= warmup) {
      out->raw_ms.push_back(r);
      out->bucketed_ms.push_back(b);
    }
  }
}

int Main() {
  torch::manual_seed(0);
  auto model = MakeModel({absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_hidden)});
  GS_CHECK(model.ok()) << model.status();
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& item : (*model)->named_parameters()) {
    names.push_back(item.key());
    params.push_back(item.value());
  }
  ReducerOptions options;
  options.first_bucket_bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_first_bucket_mb) * (1 << 20));
  options.bucket_cap_bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_bucket_cap_mb) * (1 << 20));
  std::vector<int64_t> bucket_elements;
  {
    // Only its bucket layout is used: no backward runs, so no collective.
    Reducer reducer(names, params, /*backend=*/nullptr, options);
    for (const auto& bucket : reducer.bucket_assignment()) {
      int64_t n = 0;
      for (size_t v : bucket) n += params[v].numel();
      bucket_elements.push_back(n);
    }
  }
  int64_t total = 0;
  for (int64_t n : bucket_elements) total += n;

  const int world_size = absl::GetFlag(FLAGS_world_size);
  InMemoryStore store;
  std::vector<Timings> timings(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back(RunRank, r, world_size, &store,
                         std::cref(bucket_elements), &timings[r]);
  }
  for (auto& t : threads) t.join();

  const double bytes = static_cast<double>(total) * sizeof(float);
  const double raw_ms = Median(timings[0].raw_ms);
  const double bucketed_ms = Median(timings[0].bucketed_ms);
  auto algbw = [&](double ms) { return bytes / (ms * 1e-3) / 1e9; };
  const double bus = 2.0 * (world_size - 1) / world_size;
  std::printf("%zu buckets, %.1f MB of float32 gradients, %d ranks (Gloo)\n",
              bucket_elements.size(), bytes / 1e6, world_size);
  std::printf("%-10s %10s %12s %12s\n", "", "median_ms", "algbw_GB/s",
              "busbw_GB/s");
  std::printf("%-10s %10.2f %12.3f %12.3f\n", "raw", raw_ms, algbw(raw_ms),
              algbw(raw_ms) * bus);
  std::printf("%-10s %10.2f %12.3f %12.3f\n", "bucketed", bucketed_ms,
              algbw(bucketed_ms), algbw(bucketed_ms) * bus);
  std::printf(
      "RESULT buckets=%zu bytes=%.0f raw_ms=%.3f bucketed_ms=%.3f "
      "raw_busbw=%.3f bucketed_busbw=%.3f bucketed_over_raw=%.3f\n",
      bucket_elements.size(), bytes, raw_ms, bucketed_ms, algbw(raw_ms) * bus,
      algbw(bucketed_ms) * bus, raw_ms / bucketed_ms);
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gradsync::Main();
}
