// ApplyWatchResponse: a watch's whole status rebuilt from its first message
// and the deltas after it (see WatchJobResponse in jobs.proto).
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "proto/gradsync/v1/jobs.pb.h"
#include "worker/client/coordinator_client.h"

namespace gradsync {
namespace {

v1::Member Member(int rank, int64_t step) {
  v1::Member m;
  m.set_rank(rank);
  m.mutable_metrics()->set_step(step);
  return m;
}

v1::WatchJobResponse Message(bool delta, int64_t round,
                             std::vector<v1::Member> members,
                             std::vector<int> removed = {}) {
  v1::WatchJobResponse response;
  response.set_delta(delta);
  response.mutable_job()->set_round(round);
  for (v1::Member& m : members) *response.mutable_job()->add_members() = m;
  for (int rank : removed) response.add_removed_ranks(rank);
  return response;
}

// (rank, step) of each member, in order.
std::vector<std::pair<int, int64_t>> Ranks(const v1::JobStatus& job) {
  std::vector<std::pair<int, int64_t>> out;
  for (const v1::Member& m : job.members()) {
    out.emplace_back(m.rank(), m.metrics().step());
  }
  return out;
}

using Pairs = std::vector<std::pair<int, int64_t>>;

TEST(ApplyWatchResponseTest, AWholeStatusReplacesWhatWasBuilt) {
  v1::JobStatus job;
  ApplyWatchResponse(Message(false, 1, {Member(0, 1), Member(1, 1)}), &job);
  ApplyWatchResponse(Message(false, 2, {Member(0, 0)}), &job);
  EXPECT_EQ(job.round(), 2);
  EXPECT_EQ(Ranks(job), (Pairs{{0, 0}}));
}

TEST(ApplyWatchResponseTest, ADeltaReplacesAddsAndRemovesMembersByRank) {
  v1::JobStatus job;
  ApplyWatchResponse(
      Message(false, 1, {Member(0, 1), Member(2, 1), Member(4, 1)}), &job);
  v1::WatchJobResponse delta =
      Message(true, 1, {Member(4, 9), Member(3, 0), Member(1, 0)}, {2});
  delta.mutable_job()->set_reason("rank 2 is healthy again");
  ApplyWatchResponse(delta, &job);
  EXPECT_EQ(Ranks(job), (Pairs{{0, 1}, {1, 0}, {3, 0}, {4, 9}}));
  EXPECT_EQ(job.reason(), "rank 2 is healthy again") << "fields are whole";
  // A delta that changes no member keeps them all.
  ApplyWatchResponse(Message(true, 1, {}), &job);
  EXPECT_EQ(Ranks(job), (Pairs{{0, 1}, {1, 0}, {3, 0}, {4, 9}}));
}

}  // namespace
}  // namespace gradsync
