// Ranks as threads of the test process, joined by the Gloo backend over an
// in-memory store: how the DDP tests run a world.
#ifndef GRADSYNC_TESTS_WORKER_DDP_GLOO_RANKS_H_
#define GRADSYNC_TESTS_WORKER_DDP_GLOO_RANKS_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/backend/gloo_backend.h"
#include "worker/backend/store.h"

namespace gradsync {

// Runs `body(rank, backend)` on `world_size` threads sharing a Gloo group
// (60 s timeout) and joins them.
inline void RunGlooRanks(int world_size,
                         const std::function<void(int, Backend*)>& body) {
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      BackendOptions options;
      options.rank = rank;
      options.world_size = world_size;
      options.timeout = absl::Seconds(60);
      auto backend = GlooBackend::Create(options, &store);
      ASSERT_TRUE(backend.ok()) << backend.status();
      body(rank, backend->get());
    });
  }
  for (std::thread& t : threads) t.join();
}

// `world_size` models made by `make` on the calling thread, one per rank:
// LibTorch's default generator is process-wide, so rank threads that seed
// it and draw from it at once would interleave their draws.
template <typename Make>
auto ModelsForRanks(int world_size, Make make) -> std::vector<decltype(make())> {
  std::vector<decltype(make())> models;
  for (int rank = 0; rank < world_size; ++rank) models.push_back(make());
  return models;
}

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_WORKER_DDP_GLOO_RANKS_H_
