#include "server/local_placement.h"

#include <cstddef>

namespace gradsync {

std::vector<int> PlaceLocalRanks(const std::vector<int>& slots, int nproc) {
  std::vector<int> local(slots.size(), -1);
  std::vector<bool> taken(nproc, false);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int slot = slots[i];
    if (slot >= 0 && slot < nproc && !taken[slot]) {
      local[i] = slot;
      taken[slot] = true;
    }
  }
  int next_free = 0;
  for (int& l : local) {
    if (l >= 0) continue;
    while (next_free < nproc && taken[next_free]) ++next_free;
    l = next_free;
    if (next_free < nproc) taken[next_free] = true;
  }
  return local;
}

}  // namespace gradsync
