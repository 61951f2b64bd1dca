// PendingJoins: join order, the ticket and incarnation indexes, and the
// per-node counts that say which nodes are complete, as joiners come and go.
#include "server/pending_joins.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

Joiner Process(uint64_t ticket, const std::string& node_id,
               const std::string& incarnation) {
  Joiner joiner;
  joiner.ticket = ticket;
  joiner.node.set_node_id(node_id);
  joiner.node.set_incarnation_id(incarnation);
  return joiner;
}

std::vector<uint64_t> Tickets(const PendingJoins& pending) {
  std::vector<uint64_t> tickets;
  for (const Joiner& joiner : pending) tickets.push_back(joiner.ticket);
  return tickets;
}

TEST(PendingJoinsTest, ANodeIsCompleteWithNprocWaitingProcesses) {
  PendingJoins pending(2);
  pending.Add(Process(1, "a", "a0"));
  EXPECT_EQ(pending.Waiting("a"), 1);
  EXPECT_FALSE(pending.NodeComplete("a"));
  EXPECT_EQ(pending.complete_nodes(), 0);
  pending.Add(Process(2, "b", "b0"));
  pending.Add(Process(3, "a", "a1"));
  EXPECT_TRUE(pending.NodeComplete("a"));
  EXPECT_FALSE(pending.NodeComplete("b"));
  EXPECT_EQ(pending.complete_nodes(), 1);
  pending.Add(Process(4, "b", "b1"));
  EXPECT_EQ(pending.complete_nodes(), 2);

  Joiner taken = pending.Take(pending.FindTicket(3));
  EXPECT_EQ(taken.node.incarnation_id(), "a1");
  EXPECT_EQ(pending.complete_nodes(), 1);
  EXPECT_EQ(pending.Waiting("a"), 1);
  EXPECT_EQ(pending.Waiting("nowhere"), 0);
}

TEST(PendingJoinsTest, JoinersAreFoundByTicketAndIncarnationInJoinOrder) {
  PendingJoins pending(1);
  for (uint64_t t = 1; t <= 4; ++t) {
    pending.Add(Process(t, t % 2 ? "odd" : "even", "p" + std::to_string(t)));
  }
  EXPECT_EQ(Tickets(pending), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(pending.FindIncarnation("p3")->ticket, 3u);
  EXPECT_EQ(pending.OldestOf("even")->ticket, 2u);
  pending.Take(pending.FindIncarnation("p2"));
  EXPECT_EQ(Tickets(pending), (std::vector<uint64_t>{1, 3, 4}));
  EXPECT_EQ(pending.OldestOf("even")->ticket, 4u);
  // What was taken is found no more.
  EXPECT_EQ(pending.FindTicket(2), pending.end());
  EXPECT_EQ(pending.FindIncarnation("p2"), pending.end());
  EXPECT_EQ(pending.OldestOf("elsewhere"), pending.end());
  EXPECT_EQ(pending.size(), 3u);
}

TEST(PendingJoinsTest, TakingEveryJoinerLeavesNothingCounted) {
  PendingJoins pending(2);
  pending.Add(Process(1, "a", "a0"));
  pending.Add(Process(2, "a", "a1"));
  while (!pending.empty()) pending.Take(pending.begin());
  EXPECT_EQ(pending.complete_nodes(), 0);
  EXPECT_EQ(pending.Waiting("a"), 0);
  pending.Add(Process(3, "a", "a2"));  // counts start again from zero
  EXPECT_FALSE(pending.NodeComplete("a"));
}

}  // namespace
}  // namespace gradsync
