// KvManager's store as storage keeps it: a round's keys and the records of
// its request ids (Add and CompareAndSet with one), loaded at a restart
// (RestoreRound) and after a failed commit (ReloadLocked). See
// kv_manager.h; the rest of the manager is in kv_manager.cc.
#include "server/kv_manager.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

constexpr size_t kMaxRequestIdBytes = 64;

absl::Status CheckRequestId(const std::string& id) {
  const bool fine =
      !id.empty() && id.size() <= kMaxRequestIdBytes &&
      std::all_of(id.begin(), id.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
               c == '-' || c == '_';
      });
  if (fine) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "request id must be 1-", kMaxRequestIdBytes,
      " letters, digits, '-' or '_', got '",
      absl::CHexEscape(id.substr(0, kMaxRequestIdBytes + 1)), "'"));
}

}  // namespace

absl::Status KvManager::RestoreRound(const std::string& job_id, int64_t round,
                                     bool open) {
  GS_ASSIGN_OR_RETURN(
      std::vector<Storage::Entry> entries,
      storage_->Scan(absl::StrCat("kv/", job_id, "/"), /*keys_only=*/false));
  GS_ASSIGN_OR_RETURN(
      std::vector<Storage::Entry> records,
      storage_->Scan(absl::StrCat("kvreq/", job_id, "/"), /*keys_only=*/false));
  std::move(records.begin(), records.end(), std::back_inserter(entries));
  absl::MutexLock lock(&mu_);
  JobKv& job = jobs_kv_[job_id];
  job = JobKv();
  job.round = round;
  job.open = open;
  return LoadRoundLocked(job_id, &job, std::move(entries),
                         /*drop_others=*/true);
}

absl::StatusOr<int> KvManager::DropForgottenJobs(
    const std::function<bool(const std::string& job_id)>& exists) {
  std::set<std::string> forgotten;
  for (const char* kind : {"kv/", "kvreq/"}) {
    GS_ASSIGN_OR_RETURN(std::vector<Storage::Entry> keys,
                        storage_->Scan(kind, /*keys_only=*/true));
    for (const Storage::Entry& entry : keys) {
      absl::string_view rest = absl::StripPrefix(entry.first, kind);
      std::string job_id(rest.substr(0, rest.find('/')));
      if (!exists(job_id)) forgotten.insert(std::move(job_id));
    }
  }
  std::vector<Storage::Mutation> deletes;
  for (const std::string& job_id : forgotten) {
    for (const char* kind : {"kv/", "kvreq/"}) {
      deletes.push_back({Storage::Mutation::Kind::kDeletePrefix,
                         absl::StrCat(kind, job_id, "/"), ""});
    }
  }
  if (!deletes.empty()) GS_RETURN_IF_ERROR(storage_->Apply(deletes));
  return static_cast<int>(forgotten.size());
}

absl::Status KvManager::LoadRoundLocked(const std::string& job_id, JobKv* job,
                                        std::vector<Storage::Entry> entries,
                                        bool drop_others) {
  const std::string round_prefix = KvRoundPrefix(job_id, job->round);
  const std::string request_prefix = KvRequestPrefix(job_id, job->round);
  for (auto& [key, value] : entries) {
    if (job->open && absl::StartsWith(key, round_prefix)) {
      std::string name = key.substr(round_prefix.size());
      job->bytes += static_cast<int64_t>(name.size() + value.size());
      job->entries[std::move(name)] = Value{std::move(value), 0};
      continue;
    }
    if (job->open && absl::StartsWith(key, request_prefix)) {
      if (std::optional<Applied> applied = ParseRecord(value)) {
        job->bytes += static_cast<int64_t>(key.size() + value.size());
        job->applied[key.substr(request_prefix.size())] = *std::move(applied);
        continue;
      }
      GS_LOG(WARNING) << "job '" << job_id << "': dropping the request record "
                      << key << ", which does not parse";
    } else if (!drop_others) {
      continue;
    }
    GS_RETURN_IF_ERROR(storage_->Delete(key).status());
  }
  return absl::OkStatus();
}

std::string KvManager::RecordText(const Applied& applied) {
  return applied.add ? absl::StrCat("add ", applied.value, " ", applied.key)
                     : absl::StrCat("cas ", applied.key);
}

std::optional<KvManager::Applied> KvManager::ParseRecord(
    absl::string_view text) {
  Applied applied;
  if (absl::ConsumePrefix(&text, "cas ")) {
    applied.key = std::string(text);
    return applied;
  }
  if (!absl::ConsumePrefix(&text, "add ")) return std::nullopt;
  const size_t space = text.find(' ');
  if (space == absl::string_view::npos ||
      !absl::SimpleAtoi(text.substr(0, space), &applied.value)) {
    return std::nullopt;
  }
  applied.add = true;
  applied.key = std::string(text.substr(space + 1));
  return applied;
}

absl::StatusOr<const KvManager::Applied*> KvManager::FindRequestLocked(
    const JobKv& job, const std::string& request_id, bool add,
    const std::string& key) const {
  if (request_id.empty()) return nullptr;
  GS_RETURN_IF_ERROR(CheckRequestId(request_id));
  auto it = job.applied.find(request_id);
  if (it == job.applied.end()) return nullptr;
  if (it->second.add != add || it->second.key != key) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request id '", request_id, "' came with ",
        it->second.add ? "an add to" : "a compare-and-set of", " key '",
        it->second.key, "' in this round: use a fresh id for each call"));
  }
  return &it->second;
}

void KvManager::ReloadJobsLocked(const std::set<std::string>& job_ids) {
  for (const std::string& job_id : job_ids) {
    auto it = jobs_kv_.find(job_id);
    if (it != jobs_kv_.end()) ReloadLocked(job_id, &it->second);
  }
}

void KvManager::ReloadLocked(const std::string& job_id, JobKv* job) {
  job->entries.clear();
  job->applied.clear();
  job->bytes = 0;
  if (!job->open) return;
  std::vector<Storage::Entry> entries;
  for (const std::string& prefix : {KvRoundPrefix(job_id, job->round),
                                    KvRequestPrefix(job_id, job->round)}) {
    absl::StatusOr<std::vector<Storage::Entry>> stored =
        storage_->Scan(prefix, /*keys_only=*/false);
    if (!stored.ok()) {
      GS_LOG(ERROR) << "job '" << job_id << "': cannot reload round "
                    << job->round << " from storage: " << stored.status();
      return;
    }
    std::move(stored->begin(), stored->end(), std::back_inserter(entries));
  }
  absl::Status loaded = LoadRoundLocked(job_id, job, std::move(entries),
                                        /*drop_others=*/false);
  if (!loaded.ok()) {
    GS_LOG(ERROR) << "job '" << job_id << "': reloading round " << job->round
                  << ": " << loaded;
  }
}

}  // namespace gradsync
