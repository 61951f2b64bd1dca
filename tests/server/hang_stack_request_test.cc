#include "server/hang_stack_request.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

v1::ThreadStack Thread(const std::string& name,
                       const std::vector<std::string>& frames) {
  v1::ThreadStack t;
  t.set_name(name);
  for (const std::string& f : frames) t.add_frames(f);
  return t;
}

v1::ThreadStacks Answer(int64_t id, const std::vector<v1::ThreadStack>& threads,
                        const std::string& error = "") {
  v1::ThreadStacks s;
  s.set_request(id);
  for (const v1::ThreadStack& t : threads) *s.add_threads() = t;
  s.set_error(error);
  return s;
}

std::vector<int> Ranks(const v1::StackGroup& g) {
  return std::vector<int>(g.ranks().begin(), g.ranks().end());
}

TEST(HangStackRequestTest, TellsEachAskedRankOnce) {
  HangStackRequest request;
  EXPECT_FALSE(request.asked());
  EXPECT_EQ(request.Tell(0), 0);
  request.Ask(41, {3, 5}, 0);
  EXPECT_TRUE(request.asked());
  EXPECT_EQ(request.Tell(3), 41);
  EXPECT_EQ(request.Tell(3), 0);  // told already
  EXPECT_EQ(request.Tell(0), 41);
  EXPECT_EQ(request.Tell(5), 41);
  EXPECT_EQ(request.Tell(1), 0);  // not asked
  request.Clear();
  EXPECT_FALSE(request.asked());
  EXPECT_EQ(request.Tell(5), 0);
  EXPECT_EQ(request.view().hung_ranks_size(), 0);
}

TEST(HangStackRequestTest, AsksAtMostFourRanksBehind) {
  HangStackRequest request;
  request.Ask(1, {2, 3, 4, 5, 6, 7}, -1);
  EXPECT_EQ(request.view().hung_ranks_size(), 4);
  EXPECT_EQ(request.view().healthy_rank(), -1);
  EXPECT_EQ(request.Tell(6), 0);
  EXPECT_EQ(request.Tell(5), 1);
}

TEST(HangStackRequestTest, IgnoresStaleAndUnaskedAnswers) {
  HangStackRequest request;
  request.Ask(7, {1}, 0);
  EXPECT_FALSE(request.Record(1, Answer(6, {Thread("a", {"f"})})));  // old id
  EXPECT_FALSE(request.Record(2, Answer(7, {Thread("a", {"f"})})));  // not asked
  EXPECT_EQ(request.view().answered_size(), 0);
  EXPECT_TRUE(request.Record(1, Answer(7, {Thread("a", {"f"})})));
  ASSERT_EQ(request.view().answered_size(), 1);
  EXPECT_EQ(request.view().answered(0), 1);
}

TEST(HangStackRequestTest, GroupsIdenticalStacksAcrossRanksHungOnlyFirst) {
  HangStackRequest request;
  request.Ask(9, {2, 3}, 0);
  const v1::ThreadStack grpc = Thread("grpc", {"epoll_wait", "PollerLoop"});
  const v1::ThreadStack hung =
      Thread("main", {"nanosleep", "gradsync::MaybeHang()", "main"});
  const v1::ThreadStack waiting =
      Thread("main", {"futex", "gradsync::Work::Wait()", "main"});
  ASSERT_TRUE(request.Record(0, Answer(9, {grpc, grpc, waiting})));
  ASSERT_TRUE(request.Record(2, Answer(9, {grpc, hung})));
  ASSERT_TRUE(request.Record(
      3, Answer(9, {grpc, hung, Thread("gs-deaf", {})}, "thread 12 did not answer")));

  const v1::HangStacks& view = request.view();
  EXPECT_EQ(view.healthy_rank(), 0);
  ASSERT_EQ(view.groups_size(), 3);
  // Only the hung ranks are in MaybeHang: first.
  EXPECT_TRUE(view.groups(0).hung_only());
  EXPECT_EQ(Ranks(view.groups(0)), (std::vector<int>{2, 3}));
  EXPECT_EQ(view.groups(0).threads(), 2);
  EXPECT_EQ(view.groups(0).frames(1), "gradsync::MaybeHang()");
  // Then the commonest: the gRPC threads of all three.
  EXPECT_FALSE(view.groups(1).hung_only());
  EXPECT_EQ(Ranks(view.groups(1)), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(view.groups(1).threads(), 4);
  ASSERT_EQ(view.groups(1).thread_names_size(), 1);
  EXPECT_EQ(view.groups(1).thread_names(0), "grpc");
  // The healthy rank's own.
  EXPECT_EQ(Ranks(view.groups(2)), (std::vector<int>{0}));
  // A thread without frames is in the error, not a group.
  ASSERT_EQ(view.errors_size(), 1);
  EXPECT_EQ(view.errors(0), "rank 3: thread 12 did not answer");
}

TEST(HangStackRequestTest, ANewRequestForgetsTheOldAnswers) {
  HangStackRequest request;
  request.Ask(1, {1}, 0);
  ASSERT_TRUE(request.Record(1, Answer(1, {Thread("a", {"f"})})));
  request.Ask(2, {1}, 0);
  EXPECT_EQ(request.view().answered_size(), 0);
  EXPECT_EQ(request.view().groups_size(), 0);
  EXPECT_EQ(request.Tell(1), 2);
}

}  // namespace
}  // namespace gradsync
