// Times key-value Sets of growing values against a running coordinator:
// joins a one-member job and sets one key, --repeats times per size,
// printing each call's time and the median per size. What
// bench/receive_window_bench.sh runs across a slow link.
//   bazel-bin/bench/kv_set_time --coordinator=HOST:PORT
#include <algorithm>
#include <memory>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_config.h"
#include "worker/client/grpc_coordinator_client.h"

ABSL_FLAG(std::string, coordinator, "", "the coordinator's HOST:PORT");
ABSL_FLAG(std::string, sizes, "100,65536,262144,1024000",
          "value sizes in bytes, comma-separated");
ABSL_FLAG(int, repeats, 5, "Sets per size (the first warms up)");

namespace gradsync {
namespace {

int Main() {
  std::vector<int> sizes;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    int size = 0;
    if (!absl::SimpleAtoi(s, &size) || size < 0) {
      std::fprintf(stderr, "--sizes: '%s' is not a size\n",
                   std::string(s).c_str());
      return 2;
    }
    sizes.push_back(size);
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (absl::GetFlag(FLAGS_coordinator).empty() || repeats < 2) {
    std::fprintf(stderr, "--coordinator=HOST:PORT and --repeats >= 2\n");
    return 2;
  }
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_coordinator);
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      GrpcCoordinatorClient::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  v1::JoinRequest join;
  join.set_job_id("kv-set-time");
  join.mutable_config()->set_job_id("kv-set-time");
  join.mutable_config()->set_min_nodes(1);
  *join.mutable_node() = LocalNodeDescriptor();
  absl::StatusOr<v1::Assignment> assigned = (*client)->Join(join);
  if (!assigned.ok()) {
    std::fprintf(stderr, "join: %s\n", assigned.status().ToString().c_str());
    return 1;
  }
  v1::Scope scope;
  scope.set_job_id("kv-set-time");
  scope.set_round(assigned->round());
  for (int size : sizes) {
    const std::string value(size, 'v');
    std::vector<absl::Duration> times;
    for (int i = 0; i < repeats; ++i) {
      const absl::Time start = absl::Now();
      absl::Status set = (*client)->Set(scope, "key", value);
      if (!set.ok()) {
        std::fprintf(stderr, "set %d bytes: %s\n", size,
                     set.ToString().c_str());
        return 1;
      }
      if (i > 0) times.push_back(absl::Now() - start);
    }
    std::sort(times.begin(), times.end());
    std::printf("set %d bytes: median %.3f s (of %zu after a warm-up)\n",
                size, absl::ToDoubleSeconds(times[times.size() / 2]),
                times.size());
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return gradsync::Main();
}
