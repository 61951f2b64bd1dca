// The coordinator's status page, served at / on its HTTP port
// (--metrics_listen): the jobs, and for ?job=ID its per-rank table, the
// diagnosis, recoveries and a plot of step time per rank over the last five
// minutes. One self-contained HTML document (no external scripts or
// styles); it polls /api/jobs and /api/job?id=ID (the JobStatus messages in
// protobuf's JSON, field names as in the .proto) every second and keeps the
// plot's history itself. With --auth=token the token goes in the address's
// fragment (/#token=TOKEN) and is sent as a bearer token.
#ifndef GRADSYNC_SERVER_HTTP_STATUS_PAGE_H_
#define GRADSYNC_SERVER_HTTP_STATUS_PAGE_H_

namespace gradsync {

extern const char kStatusPageHtml[];

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HTTP_STATUS_PAGE_H_
