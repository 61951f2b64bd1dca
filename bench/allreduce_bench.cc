// Bucketed gradient sync against a raw all-reduce of the same bytes, with
// ranks as threads of this process: the buckets are the ones
// DistributedDataParallel's reducer forms for the model (first bucket
// --first_bucket_mb, then --bucket_cap_mb), all-reduced back to back as the
// reducer issues them; the raw all-reduce moves the whole gradient in one
// call. Runs alternate between the two, and between the backends named in
// --backend (gloo: TCP loopback; shm: shared memory), so that machine noise
// hits all alike. Bandwidths as nccl-tests reports them: algbw = bytes /
// time, busbw = algbw * 2 (W - 1) / W; #wrong counts the elements that do
// not hold the expected average at the end.
//
//   bazel run -c opt //bench:allreduce_bench -- --hidden=2800 --world_size=2
//   bazel run -c opt //bench:allreduce_bench -- --backend=gloo,shm
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
#include "worker/ddp/reducer.h"
#include "worker/trainer/models.h"

ABSL_FLAG(int, world_size, 2, "ranks (threads)");
ABSL_FLAG(std::string, model, "mlp", "mlp or cnn");
ABSL_FLAG(int, hidden, 2800, "hidden width (2800: a 10M-parameter MLP)");
ABSL_FLAG(double, first_bucket_mb, 1.0, "first bucket cap, MiB");
ABSL_FLAG(double, bucket_cap_mb, 25.0, "bucket cap, MiB");
ABSL_FLAG(int, iterations, 20, "measured runs of each kind");
ABSL_FLAG(int, warmup, 3, "unmeasured runs of each kind first");
ABSL_FLAG(std::string, backend, "gloo",
          "gloo, shm, or a comma-separated list (\"gloo,shm\") to compare "
          "in one run");
ABSL_FLAG(int, shm_slot_kb, 0, "shm slot size, KiB (0: ShmOptions' default)");

namespace gradsync {
namespace {

// One backend's results on one rank.
struct Timings {
  std::vector<double> raw_ms;
  std::vector<double> bucketed_ms;
  // Elements that did not end holding the expected average.
  int64_t wrong = 0;
};

// A benchmark has no one to return errors to: it stops with the message.
void CheckOk(const absl::Status& status) { GS_CHECK(status.ok()) << status; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(
    const std::string& kind, const BackendOptions& options, Store* store) {
  if (kind == "gloo") {
    auto backend = GlooBackend::Create(options, store);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
  }
  if (kind == "shm") {
    ShmOptions shm;
    if (const int kb = absl::GetFlag(FLAGS_shm_slot_kb); kb > 0) {
      shm.slot_bytes = static_cast<size_t>(kb) << 10;
    }
    auto backend = ShmBackend::Create(options, store, shm);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
  }
  return absl::InvalidArgumentError("--backend: expected gloo or shm, got '" +
                                    kind + "'");
}

// One backend on one rank: a full gradient buffer and one buffer per bucket,
// rank r's holding r + 1 everywhere, so that every all-reduce (average)
// leaves (W + 1) / 2.
struct RankState {
  std::unique_ptr<Backend> backend;
  std::vector<float> flat;
  std::vector<std::vector<float>> buckets;
};

// One rank: every backend of `kinds` (in that order on every rank, each
// bootstrapping through its own store).
void RunRank(int rank, int world_size, const std::vector<std::string>& kinds,
             std::deque<InMemoryStore>* stores,
             const std::vector<int64_t>& bucket_elements,
             std::vector<Timings>* out) {
  BackendOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.timeout = absl::Minutes(2);
  int64_t total = 0;
  for (int64_t n : bucket_elements) total += n;
  const float mine = static_cast<float>(rank + 1);
  std::vector<RankState> states(kinds.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    auto backend = MakeBackend(kinds[k], options, &(*stores)[k]);
    GS_CHECK(backend.ok()) << backend.status();
    states[k].backend = std::move(*backend);
    states[k].flat.assign(total, mine);
    for (int64_t n : bucket_elements) states[k].buckets.emplace_back(n, mine);
  }

  auto raw = [&](RankState& s) {
    Buffer buffer{s.flat.data(), s.flat.size()};
    CheckOk(s.backend->AllReduce(buffer, ReduceOp::kAverage)
                ->Wait(options.timeout));
  };
  auto bucketed = [&](RankState& s) {
    std::vector<std::shared_ptr<Work>> works;
    for (auto& b : s.buckets) {
      works.push_back(
          s.backend->AllReduce(Buffer{b.data(), b.size()}, ReduceOp::kAverage));
    }
    for (auto& w : works) CheckOk(w->Wait(options.timeout));
  };
  auto timed = [&](RankState& s, auto&& fn) {
    CheckOk(s.backend->Barrier()->Wait(options.timeout));
    const absl::Time start = absl::Now();
    fn(s);
    return absl::ToDoubleMilliseconds(absl::Now() - start);
  };
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  for (int i = 0; i < warmup + iterations; ++i) {
    for (size_t j = 0; j < states.size(); ++j) {
      // Rotate which backend goes first, and alternate which kind does.
      const size_t k = (i + j) % states.size();
      double r, b;
      if (i % 2 == 0) {
        r = timed(states[k], raw);
        b = timed(states[k], bucketed);
      } else {
        b = timed(states[k], bucketed);
        r = timed(states[k], raw);
      }
      if (i >= warmup) {
        (*out)[k].raw_ms.push_back(r);
        (*out)[k].bucketed_ms.push_back(b);
      }
    }
  }
  const float expected = (world_size + 1) / 2.0f;
  for (size_t k = 0; k < states.size(); ++k) {
    for (float x : states[k].flat) (*out)[k].wrong += x != expected;
    for (const auto& b : states[k].buckets) {
      for (float x : b) (*out)[k].wrong += x != expected;
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
  const std::vector<std::string> kinds =
      absl::StrSplit(absl::GetFlag(FLAGS_backend), ',', absl::SkipEmpty());
  GS_CHECK(!kinds.empty()) << "--backend names no backend";
  std::deque<InMemoryStore> stores(kinds.size());
  // timings[r][k]: rank r, backend kinds[k].
  std::vector<std::vector<Timings>> timings(world_size,
                                            std::vector<Timings>(kinds.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back(RunRank, r, world_size, std::cref(kinds), &stores,
                         std::cref(bucket_elements), &timings[r]);
  }
  for (auto& t : threads) t.join();

  const double bytes = static_cast<double>(total) * sizeof(float);
  auto algbw = [&](double ms) { return bytes / (ms * 1e-3) / 1e9; };
  const double bus = 2.0 * (world_size - 1) / world_size;
  std::printf("%zu buckets, %.1f MB of float32 gradients, %d ranks\n",
              bucket_elements.size(), bytes / 1e6, world_size);
  std::printf("%-16s %10s %12s %12s %8s\n", "", "median_ms", "algbw_GB/s",
              "busbw_GB/s", "#wrong");
  std::vector<double> raw_ms(kinds.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    raw_ms[k] = Median(timings[0][k].raw_ms);
    const double bucketed_ms = Median(timings[0][k].bucketed_ms);
    int64_t wrong = 0;
    for (int r = 0; r < world_size; ++r) wrong += timings[r][k].wrong;
    std::printf("%-16s %10.2f %12.3f %12.3f %8lld\n",
                (kinds[k] + " raw").c_str(), raw_ms[k], algbw(raw_ms[k]),
                algbw(raw_ms[k]) * bus, static_cast<long long>(wrong));
    std::printf("%-16s %10.2f %12.3f %12.3f %8lld\n",
                (kinds[k] + " bucketed").c_str(), bucketed_ms,
                algbw(bucketed_ms), algbw(bucketed_ms) * bus,
                static_cast<long long>(wrong));
    std::printf(
        "RESULT backend=%s buckets=%zu bytes=%.0f raw_ms=%.3f bucketed_ms=%.3f "
        "raw_busbw=%.3f bucketed_busbw=%.3f bucketed_over_raw=%.3f "
        "wrong=%lld\n",
        kinds[k].c_str(), bucket_elements.size(), bytes, raw_ms[k], bucketed_ms,
        algbw(raw_ms[k]) * bus, algbw(bucketed_ms) * bus,
        raw_ms[k] / bucketed_ms, static_cast<long long>(wrong));
  }
  for (size_t k = 1; k < kinds.size(); ++k) {
    std::printf("raw all-reduce time %s / %s: %.3f\n", kinds[0].c_str(),
                kinds[k].c_str(), raw_ms[0] / raw_ms[k]);
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gradsync::Main();
}
