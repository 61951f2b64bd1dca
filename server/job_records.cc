#include "server/job_records.h"

#include <google/protobuf/field_mask.pb.h>
#include <google/protobuf/util/field_mask_util.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

using Mutation = Storage::Mutation;

// A chunk of members closes once it holds this many bytes (plus one
// member): half the smallest etcd request limit the coordinator accepts
// (64 KiB); a round of 100,000 members is about 350 chunks.
constexpr size_t kChunkBytes = 32 * 1024;

std::string RecordKey(absl::string_view job_id) {
  return absl::StrCat(kJobRecordsPrefix, job_id);
}

std::string Number(int64_t n) { return absl::StrFormat("%020d", n); }

std::string PartsPrefix(absl::string_view job_id, absl::string_view kind,
                        int64_t round) {
  return absl::StrCat(kJobRecordsPrefix, job_id, "/", kind, "/", Number(round),
                      "/");
}

Mutation Put(std::string key, std::string value) {
  Mutation m;
  m.kind = Mutation::Kind::kPut;
  m.key = std::move(key);
  m.value = std::move(value);
  return m;
}

Mutation DeletePrefix(std::string prefix) {
  Mutation m;
  m.kind = Mutation::Kind::kDeletePrefix;
  m.key = std::move(prefix);
  return m;
}

// One key under kJobRecordsPrefix, taken apart.
struct ParsedKey {
  std::string job_id;
  std::string kind;  // empty for the record; "members" or "changes"
  int64_t round = 0;
  int64_t index = 0;  // chunk or seq
};

bool ParseKey(absl::string_view key, ParsedKey* out) {
  key.remove_prefix(kJobRecordsPrefix.size());
  std::vector<absl::string_view> parts = absl::StrSplit(key, '/');
  out->job_id = std::string(parts[0]);
  if (parts.size() == 1) return !out->job_id.empty();
  if (parts.size() != 4 || (parts[1] != "members" && parts[1] != "changes")) {
    return false;
  }
  out->kind = std::string(parts[1]);
  return absl::SimpleAtoi(parts[2], &out->round) &&
         absl::SimpleAtoi(parts[3], &out->index);
}

// The parts of one job, as read.
struct JobParts {
  const Storage::Entry* record = nullptr;
  std::vector<std::pair<ParsedKey, const Storage::Entry*>> parts;
};

absl::Status DataLoss(absl::string_view key, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("stored job record '", key, "' ", what));
}

absl::Status MissingMembers(const JobParts& job, const v1::JobStatus& record) {
  return DataLoss(job.record->first,
                  absl::StrCat("has ", record.members_size(), " of the ",
                               record.world_size(), " members of round ",
                               record.round(), " stored"));
}

absl::Status ApplyChanges(const Storage::Entry& entry, v1::JobStatus* record) {
  v1::StoredMemberChanges changes;
  if (!changes.ParseFromString(entry.second)) {
    return DataLoss(entry.first, "does not parse");
  }
  for (const v1::Member& change : changes.changes()) {
    if (change.rank() < 0 || change.rank() >= record->members_size()) {
      return DataLoss(entry.first, absl::StrCat("changes rank ", change.rank()));
    }
    v1::Member* m = record->mutable_members(change.rank());
    m->set_state(change.state());
    m->set_state_reason(change.state_reason());
  }
  if (FromProtoTime(changes.update_time()) > FromProtoTime(record->update_time())) {
    *record->mutable_update_time() = changes.update_time();
  }
  return absl::OkStatus();
}

// Adds the members of the record's round to `record`, then their changes;
// parts of other rounds are stale. A record with its members inside
// (format 1) has no parts.
absl::Status Assemble(const JobParts& job, v1::JobStatus* record,
                      int64_t* next_change, std::vector<std::string>* stale) {
  const bool inline_members = record->members_size() > 0;
  for (const char* kind : {"members", "changes"}) {
    for (const auto& [key, entry] : job.parts) {
      if (key.kind != kind) continue;
      if (inline_members || key.round != record->round()) {
        stale->push_back(entry->first);
        continue;
      }
      if (key.kind == "changes") {
        GS_RETURN_IF_ERROR(ApplyChanges(*entry, record));
        *next_change = key.index + 1;
        continue;
      }
      v1::StoredMembers chunk;
      if (!chunk.ParseFromString(entry->second)) {
        return DataLoss(entry->first, "does not parse");
      }
      for (v1::Member& m : *chunk.mutable_members()) {
        *record->add_members() = std::move(m);
      }
    }
    if (!inline_members && record->members_size() != record->world_size()) {
      return MissingMembers(job, *record);
    }
  }
  return absl::OkStatus();
}

}  // namespace

void CopyAllButMembers(const v1::JobStatus& from, v1::JobStatus* to) {
  static const auto* all_but_members = [] {
    auto* mask = new google::protobuf::FieldMask();
    const google::protobuf::Descriptor* d = v1::JobStatus::descriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      if (d->field(i)->number() != v1::JobStatus::kMembersFieldNumber) {
        mask->add_paths(d->field(i)->name());
      }
    }
    return mask;
  }();
  google::protobuf::util::FieldMaskUtil::MergeOptions options;
  options.set_replace_repeated_fields(true);
  google::protobuf::util::FieldMaskUtil::MergeMessageTo(from, *all_but_members,
                                                        options, to);
}

v1::JobStatus WithoutMembers(const v1::JobStatus& record) {
  v1::JobStatus out;
  CopyAllButMembers(record, &out);
  return out;
}

void AppendStoreWhole(const v1::JobStatus& record, int64_t previous_round,
                      std::vector<Mutation>* batch) {
  const std::string& id = record.config().job_id();
  const std::string prefix = PartsPrefix(id, "members", record.round());
  // Parts of this round that a failed attempt to store it left (no record
  // names the round yet, so they are not read, but a shorter member list
  // would not overwrite them all).
  if (previous_round != record.round()) {
    batch->push_back(DeletePrefix(prefix));
    batch->push_back(DeletePrefix(PartsPrefix(id, "changes", record.round())));
  }
  v1::StoredMembers chunk;
  int64_t index = 0;
  size_t bytes = 0;
  const auto flush = [&] {
    batch->push_back(Put(absl::StrCat(prefix, Number(index++)),
                         chunk.SerializeAsString()));
    chunk.Clear();
    bytes = 0;
  };
  for (const v1::Member& m : record.members()) {
    *chunk.add_members() = m;
    bytes += m.ByteSizeLong() + 4;
    if (bytes >= kChunkBytes) flush();
  }
  if (chunk.members_size() > 0) flush();
  AppendStoreRecord(record, batch);
  if (previous_round != record.round()) {
    batch->push_back(DeletePrefix(PartsPrefix(id, "members", previous_round)));
    batch->push_back(DeletePrefix(PartsPrefix(id, "changes", previous_round)));
  }
}

void AppendStoreRecord(const v1::JobStatus& record,
                       std::vector<Mutation>* batch) {
  batch->push_back(Put(RecordKey(record.config().job_id()),
                       WithoutMembers(record).SerializeAsString()));
}

void AppendStoreChanges(absl::string_view job_id, int64_t round, int64_t seq,
                        const v1::StoredMemberChanges& changes,
                        std::vector<Mutation>* batch) {
  batch->push_back(Put(absl::StrCat(PartsPrefix(job_id, "changes", round),
                                    Number(seq)),
                       changes.SerializeAsString()));
}

void AppendRemove(absl::string_view job_id, std::vector<Mutation>* batch) {
  Mutation record;
  record.kind = Mutation::Kind::kDelete;
  record.key = RecordKey(job_id);
  batch->push_back(std::move(record));
  batch->push_back(DeletePrefix(absl::StrCat(RecordKey(job_id), "/")));
}

absl::StatusOr<LoadedJobRecords> LoadJobRecords(
    const std::vector<Storage::Entry>& entries) {
  std::map<std::string, JobParts> jobs;
  LoadedJobRecords out;
  for (const Storage::Entry& entry : entries) {
    ParsedKey key;
    if (!ParseKey(entry.first, &key)) {
      out.stale_keys.push_back(entry.first);
      continue;
    }
    JobParts& job = jobs[key.job_id];
    if (key.kind.empty()) {
      job.record = &entry;
    } else {
      job.parts.emplace_back(std::move(key), &entry);
    }
  }
  for (auto& [id, job] : jobs) {
    if (job.record == nullptr) {  // a removal cut short
      for (const auto& part : job.parts) out.stale_keys.push_back(part.second->first);
      continue;
    }
    v1::JobStatus record;
    if (!record.ParseFromString(job.record->second) ||
        record.config().job_id() != id) {
      return DataLoss(job.record->first, "does not parse");
    }
    if (record.members_size() > 0) out.inline_members.push_back(id);
    int64_t next_change = 0;
    GS_RETURN_IF_ERROR(Assemble(job, &record, &next_change, &out.stale_keys));
    out.next_change[id] = next_change;
    out.records[id] = std::move(record);
  }
  return out;
}

}  // namespace gradsync
