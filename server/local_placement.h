// Where a node's processes sit within it: their local ranks in a new round.
// A pure decision, apart from the rendezvous that applies it.
#ifndef GRADSYNC_SERVER_LOCAL_PLACEMENT_H_
#define GRADSYNC_SERVER_LOCAL_PLACEMENT_H_

#include <vector>

namespace gradsync {

// The local rank of each of a node's processes, given the local rank each
// keeps from earlier rounds (`slots[i]`, -1 for none): a process keeps its
// slot when it is in [0, nproc) and no earlier process of the list claimed
// it; the others take the free local ranks in list (join) order. Local
// ranks stay put across rounds, so a process on a GPU keeps its device and a
// replacement gets the one a lost process left free. `slots` holds nproc
// entries.
std::vector<int> PlaceLocalRanks(const std::vector<int>& slots, int nproc);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_LOCAL_PLACEMENT_H_
