#include "worker/client/coordinator_client.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_format.h"

namespace gradsync {

void ApplyWatchResponse(v1::WatchJobResponse response, v1::JobStatus* job) {
  if (!response.delta()) {
    *job = std::move(*response.mutable_job());
    return;
  }
  google::protobuf::RepeatedPtrField<v1::Member> members;
  members.Swap(job->mutable_members());
  google::protobuf::RepeatedPtrField<v1::Member> changed;
  changed.Swap(response.mutable_job()->mutable_members());
  *job = std::move(*response.mutable_job());
  absl::flat_hash_map<int, int> index;  // rank -> position in `members`
  for (int i = 0; i < members.size(); ++i) index[members[i].rank()] = i;
  bool reorder = false;
  for (v1::Member& m : changed) {
    auto at = index.find(m.rank());
    if (at != index.end()) {
      members[at->second] = std::move(m);
    } else {
      *members.Add() = std::move(m);
      reorder = true;
    }
  }
  if (response.removed_ranks_size() > 0) {
    const absl::flat_hash_set<int> removed(response.removed_ranks().begin(),
                                           response.removed_ranks().end());
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [&](const v1::Member& m) {
                                   return removed.contains(m.rank());
                                 }),
                  members.end());
  }
  if (reorder) {
    std::sort(members.begin(), members.end(),
              [](const v1::Member& a, const v1::Member& b) {
                return a.rank() < b.rank();
              });
  }
  job->mutable_members()->Swap(&members);
}

std::string NewRandomId() {
  absl::BitGen random;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(random),
                         absl::Uniform<uint64_t>(random));
}

v1::NodeDescriptor LocalNodeDescriptor() {
  v1::NodeDescriptor node;
  char hostname[256] = {};
  if (gethostname(hostname, sizeof(hostname) - 1) == 0) {
    node.set_hostname(hostname);
  } else {
    node.set_hostname("localhost");
  }
  node.set_node_id(node.hostname());
  node.set_pid(getpid());
  node.set_incarnation_id(NewRandomId());
  node.set_device_type(v1::DEVICE_TYPE_CPU);
  node.set_device_count(1);
  node.set_nccl_available(false);
  return node;
}

}  // namespace gradsync
