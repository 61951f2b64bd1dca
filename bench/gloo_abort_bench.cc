// What making Gloo's collectives abortable costs: gloo::allreduce through
// gradsync's AbortableGlooContext (worker/backend/abortable_gloo_context.h:
// every unbound buffer wrapped and registered for its life) against the same
// through Gloo's own rendezvous context, side by side in one process. Ranks
// are threads over loopback TCP; the two groups connect once, then rounds
// alternate between them, and the ratio is the median of the rounds'
// ratios (abortable / Gloo's). Each rank checks the sum it got.
//
//   bazel run -c opt //bench:gloo_abort_bench -- --world_size=2
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/backend/abortable_gloo_context.h"

ABSL_FLAG(int, world_size, 2, "ranks (threads)");
ABSL_FLAG(std::string, sizes, "1,16384,1048576",
          "float32 elements per allreduce, comma-separated");
ABSL_FLAG(int, rounds, 9, "rounds per size and context");
ABSL_FLAG(int64_t, bytes_per_round, 64 << 20,
          "bytes a round all-reduces (at least 200 and at most 5,000 "
          "allreduces a round)");

namespace gradsync {
namespace {

// One context per rank, connected through one in-process store.
std::vector<std::shared_ptr<gloo::Context>> Connect(int n, bool abortable) {
  gloo::rendezvous::HashStore store;
  std::vector<std::shared_ptr<gloo::Context>> contexts(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto device = gloo::transport::tcp::CreateDevice(attr);
      if (abortable) {
        auto context = std::make_shared<AbortableGlooContext>(r, n);
        context->ConnectFullMesh(store, device);
        contexts[r] = context;
      } else {
        auto context = std::make_shared<gloo::rendezvous::Context>(r, n);
        context->connectFullMesh(store, device);
        contexts[r] = context;
      }
    });
  }
  for (auto& t : threads) t.join();
  return contexts;
}

// Seconds per allreduce of `count` floats, `iterations` back to back on
// every rank; exits if a sum is wrong.
double TimeAllreduce(const std::vector<std::shared_ptr<gloo::Context>>& group,
                     size_t count, int iterations) {
  const int n = static_cast<int>(group.size());
  std::vector<std::vector<float>> data(n, std::vector<float>(count));
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (int i = 0; i < iterations; ++i) {
        std::fill(data[r].begin(), data[r].end(), 1.0f);
        gloo::AllreduceOptions opts(group[r]);
        opts.setOutput<float>(data[r].data(), count);
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(
                &gloo::sum<float>));
        opts.setTag(static_cast<uint32_t>(i));
        gloo::allreduce(opts);
      }
      if (data[r][0] != static_cast<float>(n) ||
          data[r][count - 1] != static_cast<float>(n)) {
        std::fprintf(stderr, "rank %d: wrong sum %g\n", r, data[r][0]);
        std::exit(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  return absl::ToDoubleSeconds(absl::Now() - start) / iterations;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int Main() {
  const int n = absl::GetFlag(FLAGS_world_size);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const auto gloo_group = Connect(n, /*abortable=*/false);
  const auto abortable_group = Connect(n, /*abortable=*/true);
  std::printf("world %d, %d rounds each, alternating\n", n, rounds);
  std::printf("%12s %10s %14s %14s %8s\n", "floats", "per round",
              "gloo us/op", "abortable us/op", "ratio");
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t count = 0;
    if (!absl::SimpleAtoi(item, &count) || count == 0) {
      std::fprintf(stderr, "--sizes: '%s' is not a positive count\n",
                   std::string(item).c_str());
      return 2;
    }
    const int iterations = static_cast<int>(std::clamp<int64_t>(
        absl::GetFlag(FLAGS_bytes_per_round) / (count * sizeof(float)), 200,
        5000));
    std::vector<double> gloo_times, abortable_times, ratios;
    for (int round = 0; round < rounds; ++round) {
      // Which goes first alternates too.
      double g, a;
      if (round % 2 == 0) {
        g = TimeAllreduce(gloo_group, count, iterations);
        a = TimeAllreduce(abortable_group, count, iterations);
      } else {
        a = TimeAllreduce(abortable_group, count, iterations);
        g = TimeAllreduce(gloo_group, count, iterations);
      }
      gloo_times.push_back(g);
      abortable_times.push_back(a);
      ratios.push_back(a / g);
    }
    std::printf("%12zu %10d %14.1f %14.1f %8.3f\n", count, iterations,
                Median(gloo_times) * 1e6, Median(abortable_times) * 1e6,
                Median(ratios));
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gradsync::Main();
}
