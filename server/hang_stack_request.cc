#include "server/hang_stack_request.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradsync {
namespace {

constexpr size_t kMaxNames = 8;

// Threads with one stack, while grouping.
struct Threads {
  std::set<int> ranks;
  int count = 0;
  std::vector<std::string> names;  // distinct, in order of appearance
  bool healthy = false;            // the healthy rank has it too
  const v1::ThreadStack* first = nullptr;
};

}  // namespace

void HangStackRequest::Ask(int64_t id, std::vector<int> behind, int ahead) {
  Clear();
  if (behind.size() > kMaxBehind) behind.resize(kMaxBehind);
  id_ = id;
  behind_ = std::move(behind);
  ahead_ = ahead;
  Group();
}

void HangStackRequest::Clear() {
  id_ = 0;
  behind_.clear();
  ahead_ = -1;
  told_.clear();
  answers_.clear();
  view_.Clear();
}

bool HangStackRequest::Asked(int rank) const {
  return rank == ahead_ ||
         std::find(behind_.begin(), behind_.end(), rank) != behind_.end();
}

int64_t HangStackRequest::Tell(int rank) {
  if (id_ == 0 || !Asked(rank) || !told_.insert(rank).second) return 0;
  return id_;
}

bool HangStackRequest::Record(int rank, const v1::ThreadStacks& stacks) {
  if (id_ == 0 || stacks.request() != id_ || !Asked(rank)) return false;
  answers_[rank] = stacks;
  Group();
  return true;
}

void HangStackRequest::Group() {
  view_.Clear();
  if (id_ == 0) return;
  for (int rank : behind_) view_.add_hung_ranks(rank);
  view_.set_healthy_rank(ahead_);
  std::map<std::string, Threads> by_stack;
  for (const auto& [rank, stacks] : answers_) {
    view_.add_answered(rank);
    if (!stacks.error().empty()) {
      view_.add_errors(absl::StrCat("rank ", rank, ": ", stacks.error()));
    }
    for (const v1::ThreadStack& t : stacks.threads()) {
      if (t.frames_size() == 0) continue;  // did not answer: in the error
      Threads& g = by_stack[absl::StrJoin(t.frames(), "\n")];
      g.ranks.insert(rank);
      ++g.count;
      g.healthy = g.healthy || rank == ahead_;
      if (g.first == nullptr) g.first = &t;
      if (g.names.size() < kMaxNames &&
          std::find(g.names.begin(), g.names.end(), t.name()) == g.names.end()) {
        g.names.push_back(t.name());
      }
    }
  }
  // What only the hung ranks show first, then the commonest stacks.
  std::vector<const Threads*> order;
  for (const auto& [key, g] : by_stack) order.push_back(&g);
  std::stable_sort(order.begin(), order.end(),
                   [](const Threads* a, const Threads* b) {
                     return std::make_tuple(a->healthy, -a->count) <
                            std::make_tuple(b->healthy, -b->count);
                   });
  for (const Threads* g : order) {
    if (view_.groups_size() == kMaxGroups) {
      view_.add_errors(absl::StrCat(order.size() - kMaxGroups,
                                    " more distinct stacks left out"));
      break;
    }
    v1::StackGroup* out = view_.add_groups();
    for (int rank : g->ranks) out->add_ranks(rank);
    out->set_threads(g->count);
    for (const std::string& name : g->names) out->add_thread_names(name);
    *out->mutable_frames() = g->first->frames();
    out->set_hung_only(!g->healthy);
  }
}

}  // namespace gradsync
