// PlaceRound, the rendezvous's placement decision as a pure function: which
// waiting processes form a round, node ranks, local ranks, backend, resume
// source; without a RendezvousManager.
#include "server/round_placement.h"

#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::JobConfig Config(int max_nodes, int nproc) {
  v1::JobConfig config;
  config.set_job_id("train");
  config.set_min_nodes(1);
  config.set_max_nodes(max_nodes);
  config.set_nproc_per_node(nproc);
  return config;
}

// Candidates keep pointers to these descriptors.
class RoundPlacementTest : public ::testing::Test {
 protected:
  void Add(const std::string& node_id, const std::string& host = "host",
           int local_slot = -1, bool has_state = false, int64_t step = 0,
           v1::DeviceType device = v1::DEVICE_TYPE_CPU) {
    v1::NodeDescriptor& node = nodes_.emplace_back();
    node.set_node_id(node_id);
    node.set_hostname(host);
    node.set_device_type(device);
    if (device != v1::DEVICE_TYPE_CPU) {
      node.set_device_count(8);
      node.set_nccl_available(true);
    }
    candidates_.push_back({node_id, nullptr, local_slot, has_state, step});
  }

  Placement Place(const v1::JobConfig& config) {
    for (size_t i = 0; i < candidates_.size(); ++i) {
      candidates_[i].node = &nodes_[i];
    }
    return PlaceRound(config, 7, candidates_, returning_, remembered_);
  }

  std::deque<v1::NodeDescriptor> nodes_;  // stable addresses
  std::vector<PlacementCandidate> candidates_;
  absl::flat_hash_set<std::string> returning_;
  absl::flat_hash_map<std::string, int> remembered_;
};

TEST_F(RoundPlacementTest, CompleteNodesInJoinOrderUpToMax) {
  Add("a");
  Add("b");
  Add("c");  // only one of its two processes is here
  Add("b");
  Add("a");
  Add("d");
  Add("d");
  Placement p = Place(Config(/*max_nodes=*/2, /*nproc=*/2));
  EXPECT_THAT(p.nodes, ElementsAre("a", "b")) << "d is past max_nodes";
  EXPECT_THAT(p.node_rank, ElementsAre(0, 1));
  EXPECT_THAT(p.processes, ElementsAre(ElementsAre(0, 4), ElementsAre(1, 3)));
  EXPECT_EQ(p.shape.round, 7);
  EXPECT_EQ(p.shape.world_size, 4);
  EXPECT_EQ(p.shape.num_nodes, 2);
  EXPECT_TRUE(p.shape.single_host);
}

TEST_F(RoundPlacementTest, ReturningNodesComeFirstAndKeepTheirNodeRanks) {
  Add("spare", "h1");
  Add("b", "h2");
  Add("a", "h3");
  returning_ = {"a", "b"};
  remembered_ = {{"a", 0}, {"b", 2}};  // b's old rank 2 is out of range now
  Placement p = Place(Config(/*max_nodes=*/2, /*nproc=*/1));
  EXPECT_THAT(p.nodes, ElementsAre("b", "a")) << "the spare waits";
  EXPECT_THAT(p.node_rank, ElementsAre(1, 0)) << "a keeps 0, b takes the free 1";
  EXPECT_FALSE(p.shape.single_host);
}

TEST_F(RoundPlacementTest, ARememberedRankTakenByAnEarlierNodeIsNotShared) {
  Add("a");
  Add("b");
  Add("c");
  remembered_ = {{"a", 1}, {"b", 1}};
  Placement p = Place(Config(/*max_nodes=*/3, /*nproc=*/1));
  EXPECT_THAT(p.node_rank, ElementsAre(1, 0, 2));
}

TEST_F(RoundPlacementTest, LocalSlotsOrderANodesProcesses) {
  Add("a", "host", /*local_slot=*/1);
  Add("a", "host", /*local_slot=*/0);
  Add("a", "host");
  Placement p = Place(Config(/*max_nodes=*/1, /*nproc=*/3));
  EXPECT_THAT(p.processes, ElementsAre(ElementsAre(1, 0, 2)));
}

TEST_F(RoundPlacementTest, ResumesFromTheMostAdvancedRankByRank) {
  Add("a", "h", -1, /*has_state=*/true, /*step=*/5);
  Add("b", "h", -1, /*has_state=*/true, /*step=*/9);
  Add("c");
  remembered_ = {{"b", 2}};
  Placement p = Place(Config(/*max_nodes=*/3, /*nproc=*/1));
  EXPECT_THAT(p.node_rank, ElementsAre(0, 2, 1));
  EXPECT_EQ(p.shape.resume_step, 9);
  EXPECT_EQ(p.shape.source_rank, 2) << "b's rank, not its join index";
  EXPECT_TRUE(p.shape.resumed_in_place);
}

TEST_F(RoundPlacementTest, InPlaceOnlyWhenSomeProcessHoldsState) {
  Add("a");
  Add("b");
  EXPECT_FALSE(Place(Config(/*max_nodes=*/2, /*nproc=*/1)).shape.resumed_in_place);
  Add("c", "h", -1, /*has_state=*/true, /*step=*/0);
  EXPECT_TRUE(Place(Config(/*max_nodes=*/3, /*nproc=*/1)).shape.resumed_in_place)
      << "state at step 0 is still state";
}

TEST_F(RoundPlacementTest, NcclOnlyWhenEveryProcessCanUseIt) {
  Add("a", "h", -1, false, 0, v1::DEVICE_TYPE_CUDA);
  Add("b", "h", -1, false, 0, v1::DEVICE_TYPE_CUDA);
  EXPECT_EQ(Place(Config(2, 1)).shape.backend, v1::BACKEND_NCCL);
  Add("c", "h");
  EXPECT_EQ(Place(Config(3, 1)).shape.backend, v1::BACKEND_GLOO);
}

TEST_F(RoundPlacementTest, NoCompleteNodeIsAnEmptyRound) {
  Add("a");
  Placement p = Place(Config(/*max_nodes=*/2, /*nproc=*/2));
  EXPECT_THAT(p.nodes, IsEmpty());
  EXPECT_EQ(p.shape.world_size, 0);
}

}  // namespace
}  // namespace gradsync
