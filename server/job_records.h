// How a job's record (v1::JobStatus) is kept in Storage: in parts, so that a
// change to a few members writes bytes in proportion to them, never the whole
// job (a job of 100,000 members is about 15 MB).
//
//   jobs/<id>                            the record without its members
//   jobs/<id>/members/<round>/<chunk>    v1::StoredMembers: the members of
//                                        the record's round, consecutive
//                                        ranks, chunks of about 32 KiB
//   jobs/<id>/changes/<round>/<seq>      v1::StoredMemberChanges: changes
//                                        to that round's members since it
//                                        closed, applied in seq order
//
// (numbers zero-padded, so key order is numeric order). A round's members
// are written before the record that names the round, and the previous
// round's parts are removed after it, so that a backend that applies a long
// batch in several commits (etcd) never leaves a record without its
// members: what a crash between commits leaves behind is parts of no round
// the record names, which LoadJobRecords reports for removal. A record whose
// members are inside it (state format 1) is read as it is and reported for
// rewriting in parts.
//
// Pure functions over keys and bytes: no storage is called here.
#ifndef GRADSYNC_SERVER_JOB_RECORDS_H_
#define GRADSYNC_SERVER_JOB_RECORDS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/gradsync/v1/job.pb.h"
#include "server/storage/storage.h"

namespace gradsync {

// Every key of every job starts with this.
inline constexpr absl::string_view kJobRecordsPrefix = "jobs/";

// Copies every field of `from` but its members into `to` (repeated fields
// replaced, not appended); the cost of the record without its members.
void CopyAllButMembers(const v1::JobStatus& from, v1::JobStatus* to);

// `record` without its members (CopyAllButMembers into a new message).
v1::JobStatus WithoutMembers(const v1::JobStatus& record);

// Appends the writes that store `record` whole (it and its members, for a
// round that just closed): first the removal of any parts of its round (a
// failed attempt's), then its members, the record, and the removal of the
// parts of `previous_round`.
void AppendStoreWhole(const v1::JobStatus& record, int64_t previous_round,
                      std::vector<Storage::Mutation>* batch);

// Appends the write of `record` (its members are not written; they must
// be stored already).
void AppendStoreRecord(const v1::JobStatus& record,
                       std::vector<Storage::Mutation>* batch);

// Appends the write of the `seq`th change record of `round` of `job_id`.
void AppendStoreChanges(absl::string_view job_id, int64_t round, int64_t seq,
                        const v1::StoredMemberChanges& changes,
                        std::vector<Storage::Mutation>* batch);

// Appends the removal of the job: its record first, then its parts.
void AppendRemove(absl::string_view job_id,
                  std::vector<Storage::Mutation>* batch);

// What LoadJobRecords found.
struct LoadedJobRecords {
  // job id -> record, members and their changes applied.
  std::map<std::string, v1::JobStatus> records;
  // job id -> the seq the job's next change record takes.
  std::map<std::string, int64_t> next_change;
  // Keys of parts no record names (left by a crash between commits).
  std::vector<std::string> stale_keys;
  // Jobs whose members are inside their record (state format 1).
  std::vector<std::string> inline_members;
};

// Reads every entry under kJobRecordsPrefix (a Scan of it, in key order).
// DATA_LOSS naming the key for a value that does not parse, and for a
// record whose round's members are not all stored.
absl::StatusOr<LoadedJobRecords> LoadJobRecords(
    const std::vector<Storage::Entry>& entries);

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOB_RECORDS_H_
