#include "server/local_placement.h"

#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(PlaceLocalRanksTest, ProcessesKeepTheirSlotsAndNewOnesTakeTheFreeOnes) {
  // No slots: join order.
  EXPECT_EQ(PlaceLocalRanks({-1, -1, -1}, 3), (std::vector<int>{0, 1, 2}));
  // Survivors keep 3, 0 and 2; the replacement takes the 1 its lost
  // predecessor left free, wherever it joined.
  EXPECT_EQ(PlaceLocalRanks({3, -1, 0, 2}, 4), (std::vector<int>{3, 1, 0, 2}));
  // A slot claimed twice, or out of range, goes to the first claimant only;
  // the others take free slots.
  EXPECT_EQ(PlaceLocalRanks({1, 1, 7}, 3), (std::vector<int>{1, 0, 2}));
}

}  // namespace
}  // namespace gradsync
