// libFuzzer harness of the coordinator's HTTP routes (--metrics_listen:
// /metrics, the status page /, /api/jobs, /api/job?id=&members=&from=&to=
// &limit=), without sockets: each input builds a coordinator (not started)
// holding a few jobs with tokens (--auth=token), lets the input change its
// state as workers would (joins, heartbeats, completions, time passing, all
// parsed from serialized requests as the gRPC layer parses them), and sends
// GET requests with fuzzed targets and Authorization headers. A target is
// parsed by cpp-httplib's own request-line parser and routed as its server
// routes (a route's path is a regex matched in full); the route's handler
// runs as HttpServer calls it. Every answer must be well-formed:
//   - a status the HTTP server maps to 200, 400, 401, 403 or 404, never an
//     internal error (500);
//   - who may see what: no token or an unknown one is 401 except on /;
//     a job's token is 403 on /metrics and on other jobs, and /api/jobs
//     lists only its job; the admin sees every job;
//   - /api/* bodies are JSON (nlohmann-json parses them) describing the job
//     asked for, /metrics is Prometheus text (every line a HELP, TYPE or
//     sample line, label values escaped, values numbers);
//   - no body shows a token the input did not hold.
// Not covered here: HttpServer's glue around the handlers (the
// hostile client test sends real HTTP requests).
//
// Input: records of [kind byte][length byte][length bytes]; see Apply().
// tests/fuzz/run.sh builds and runs it.
#include <google/protobuf/stubs/logging.h>
#include <httplib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"
#include "proto/gradsync/v1/health.pb.h"
#include "proto/gradsync/v1/rendezvous.pb.h"
#include "server/authenticator.h"
#include "server/coordinator.h"
#include "server/http/http_server.h"
#include "server/http/status_page.h"

namespace gradsync {
namespace {

// The harness reaches three private members, which C++ allows only in an
// explicit instantiation ([temp.explicit]: access checking does not apply
// to the names it uses): Coordinator::HttpRoutes() (the routes
// HttpServer serves), Coordinator::auth_ (to issue job tokens as
// CreateJob does) and httplib::Server::parse_request_line.
template <typename Tag, typename Tag::type kMember>
struct PrivateMember {
  friend typename Tag::type Pointer(Tag) { return kMember; }
};
struct HttpRoutesOf {
  using type = std::vector<HttpRoute> (Coordinator::*)();
  friend type Pointer(HttpRoutesOf);
};
template struct PrivateMember<HttpRoutesOf, &Coordinator::HttpRoutes>;
struct AuthOf {
  using type = Authenticator Coordinator::*;
  friend type Pointer(AuthOf);
};
template struct PrivateMember<AuthOf, &Coordinator::auth_>;
struct ParseRequestLineOf {
  using type = bool (httplib::Server::*)(const char*, httplib::Request&);
  friend type Pointer(ParseRequestLineOf);
};
template struct PrivateMember<ParseRequestLineOf, &httplib::Server::parse_request_line>;

constexpr char kAdminToken[] = "admin-token-for-the-http-fuzzer";

[[noreturn]] void Fail(const std::string& what) {
  fprintf(stderr, "http_routes_fuzzer: %s\n", what.c_str());
  std::abort();
}

v1::NodeDescriptor Node(const std::string& host, const std::string& incarnation) {
  v1::NodeDescriptor node;
  node.set_hostname(host);
  node.set_incarnation_id(incarnation);
  node.set_pid(7);
  node.add_addresses("10.0.0.1");
  node.set_device_type(v1::DEVICE_TYPE_CPU);
  node.set_device_count(1);
  return node;
}

v1::JobConfig Config(const std::string& job, int nodes, int nproc) {
  v1::JobConfig config;
  config.set_job_id(job);
  config.set_min_nodes(nodes);
  config.set_max_nodes(nodes);
  config.set_nproc_per_node(nproc);
  return config;
}

CoordinatorConfig CoordinatorConfigWith(Clock* clock) {
  CoordinatorConfig config;
  config.clock = clock;
  config.admin_token = kAdminToken;
  return config;
}

// A coordinator with four jobs: "train" (a round of two nodes, one with a
// host name full of what text formats escape, heartbeating with extreme
// metrics), "big" (70 ranks: past what the status page lists in full),
// "queued" (created, nobody joined) and "done" (FAILED); each with a token,
// "train"'s issued twice.
struct World {
  FakeClock clock;
  Coordinator coordinator{CoordinatorConfigWith(&clock)};
  Authenticator& auth = coordinator.*Pointer(AuthOf());
  const std::vector<HttpRoute> routes = (coordinator.*Pointer(HttpRoutesOf()))();
  std::map<std::string, std::string> token_of;  // job -> its token
  std::string revoked;                          // "train"'s first token
  // incarnation -> its assignment, for heartbeats
  std::map<std::string, v1::Assignment> assigned;

  World();
  void Join(v1::JoinRequest request) {
    const std::string incarnation = request.node().incarnation_id();
    coordinator.rendezvous().Join(
        request, [this, incarnation](absl::StatusOr<v1::Assignment> a) {
          if (a.ok()) assigned[incarnation] = *a;
        });
  }
  void Heartbeat(const std::string& incarnation, v1::WorkerMetrics metrics) {
    auto a = assigned.find(incarnation);
    if (a == assigned.end()) Fail(absl::StrCat(incarnation, " has no rank"));
    v1::HeartbeatRequest request;
    request.mutable_member()->set_job_id(a->second.job_id());
    request.mutable_member()->set_round(a->second.round());
    request.mutable_member()->set_rank(a->second.rank());
    request.mutable_member()->set_incarnation_id(incarnation);
    *request.mutable_metrics() = std::move(metrics);
    auto session = HealthManager::NewSession();
    v1::HeartbeatResponse response;
    absl::StatusOr<bool> ok =
        coordinator.health().Heartbeat(session.get(), &request, &response);
    if (!ok.ok()) Fail(absl::StrCat("heartbeat: ", ok.status().ToString()));
  }
  void Poll() {
    coordinator.rendezvous().Poll();
    coordinator.kv().Poll();
    coordinator.health().Poll();
  }
};

World::World() {
  v1::JoinRequest join;
  join.set_job_id("train");
  *join.mutable_config() = Config("train", 2, 1);
  *join.mutable_node() = Node("node-0", "t0");
  Join(join);
  join.clear_config();
  *join.mutable_node() = Node("h\"\\\n<b>&amp;'\xc3\xa9\x7f", "t1");
  Join(join);

  v1::JoinNodeRequest node;
  node.set_job_id("big");
  *node.mutable_config() = Config("big", 1, 70);
  for (int i = 0; i < 70; ++i) {
    *node.add_processes()->mutable_node() = Node("big-node", absl::StrCat("b", i));
  }
  coordinator.rendezvous().JoinNode(
      node, [this](absl::StatusOr<std::vector<v1::Assignment>> all) {
        if (!all.ok()) return;
        for (const v1::Assignment& a : *all) assigned[absl::StrCat("b", a.rank())] = a;
      });

  if (!coordinator.jobs().Create(Config("queued", 4, 2)).ok()) Fail("create queued");

  join.set_job_id("done");
  *join.mutable_config() = Config("done", 1, 1);
  *join.mutable_node() = Node("node-9", "d0");
  Join(join);
  clock.Advance(absl::Seconds(1));
  Poll();

  v1::WorkerMetrics metrics;
  metrics.set_state(v1::WORKER_STATE_TRAINING);
  metrics.set_step(40);
  metrics.set_samples_per_second(1e308);
  metrics.mutable_step_timings()->set_step_seconds(0.25);
  Heartbeat("t0", metrics);
  metrics.set_step(39);  // behind rank 0 (a negative one is refused)
  metrics.set_samples_per_second(std::numeric_limits<double>::quiet_NaN());
  metrics.mutable_step_timings()->set_step_seconds(
      -std::numeric_limits<double>::infinity());
  metrics.set_last_error("boom: \"quoted\"\n\\ <script>");
  v1::BucketStats* bucket = metrics.add_buckets();
  bucket->set_bytes(int64_t{1} << 62);
  bucket->set_allreduce_seconds(std::numeric_limits<double>::infinity());
  Heartbeat("t1", metrics);
  for (int r = 0; r < 70; ++r) {
    v1::WorkerMetrics m;
    m.set_step(r < 60 ? 100 : 90);
    Heartbeat(absl::StrCat("b", r), m);
  }
  v1::ReportCompletionRequest failed;
  failed.mutable_member()->set_job_id("done");
  failed.mutable_member()->set_round(assigned["d0"].round());
  failed.mutable_member()->set_rank(assigned["d0"].rank());
  failed.mutable_member()->set_incarnation_id("d0");
  failed.set_success(false);
  failed.set_exit_code(3);
  failed.set_message("out of memory: \"x\"\n\t\\");
  coordinator.health().ReportCompletion(failed).status().IgnoreError();
  clock.Advance(absl::Milliseconds(500));
  Poll();

  for (const char* job : {"train", "train", "big", "queued", "done"}) {
    absl::StatusOr<std::string> token = auth.IssueToken(job);
    if (!token.ok()) Fail(token.status().ToString());
    if (token_of.count(job) > 0) revoked = token_of[job];
    token_of[job] = *token;
  }
}

// Whether `text` is Prometheus text as prometheus-cpp writes it; `why` says
// where it is not.
bool IsPrometheusText(const std::string& text, std::string* why) {
  if (text.empty() || text.back() != '\n') {
    *why = "does not end with a newline";
    return false;
  }
  const auto name_char = [](char c, bool first) {
    return absl::ascii_isalpha(c) || c == '_' || c == ':' ||
           (!first && absl::ascii_isdigit(c));
  };
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(text).substr(0, text.size() - 1), '\n')) {
    *why = absl::StrCat("line '", absl::CEscape(line), "'");
    if (absl::StartsWith(line, "# HELP ")) continue;
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
      if (words.size() != 4 || (words[3] != "counter" && words[3] != "gauge" &&
                                words[3] != "histogram")) {
        return false;
      }
      continue;
    }
    size_t at = 0;
    while (at < line.size() && name_char(line[at], at == 0)) ++at;
    if (at == 0) return false;
    if (at < line.size() && line[at] == '{') {
      ++at;
      while (true) {
        const size_t name_start = at;
        while (at < line.size() && name_char(line[at], at == name_start)) ++at;
        if (at == name_start || line.substr(at, 2) != "=\"") return false;
        at += 2;
        while (at < line.size() && line[at] != '"') {
          if (line[at] == '\\') {
            if (at + 1 >= line.size() || !absl::StrContains("\\\"n", line[at + 1])) {
              return false;
            }
            ++at;
          }
          ++at;
        }
        if (at >= line.size()) return false;
        ++at;  // the closing quote
        if (at < line.size() && line[at] == ',') {
          ++at;
          continue;
        }
        if (at < line.size() && line[at] == '}') {
          ++at;
          break;
        }
        return false;
      }
    }
    if (at >= line.size() || line[at] != ' ') return false;
    const absl::string_view value = line.substr(at + 1);
    double parsed;
    // prometheus-cpp writes NaN as "Nan" (parsers take any case).
    if (value != "Nan" && value != "NaN" && value != "+Inf" && value != "-Inf" &&
        !absl::SimpleAtod(value, &parsed)) {
      return false;
    }
  }
  return true;
}

// Sends `target` with `authorization` (nullptr: none) and checks the answer.
void Send(World& w, const std::string& target, const std::string* authorization,
         const std::string& input) {
  // As cpp-httplib's server parses a request line: a bad one is answered
  // 400 before any route runs.
  static httplib::Server* const parser = new httplib::Server();
  httplib::Request request;
  if (target.find('\0') != std::string::npos ||
      !(parser->*Pointer(ParseRequestLineOf()))(
          absl::StrCat("GET ", target, " HTTP/1.1\r\n").c_str(), request)) {
    return;
  }
  const HttpRoute* route = nullptr;
  for (const HttpRoute& r : w.routes) {
    if (std::regex_match(request.path, std::regex(r.path))) {
      route = &r;
      break;
    }
  }
  if (route == nullptr) return;  // 404
  // As HttpServer hands a request to a route.
  HttpRequest seen;
  seen.params.insert(request.params.begin(), request.params.end());
  seen.authorization = authorization;
  const absl::StatusOr<std::string> body = route->render(seen);

  // Who the caller is.
  bool admin = false;
  std::string job;  // for a job's token
  if (authorization != nullptr) {
    if (*authorization == absl::StrCat("Bearer ", kAdminToken)) admin = true;
    for (const auto& [j, token] : w.token_of) {
      if (*authorization == absl::StrCat("Bearer ", token)) job = j;
    }
  }
  const bool known = admin || !job.empty();
  const std::string where = absl::StrCat(
      "GET ", absl::CEscape(target), " as ",
      admin ? "the admin" : !job.empty() ? absl::StrCat("job ", job) : "nobody", ": ");
  const absl::Status& status = body.status();
  if (!status.ok() && !absl::IsUnauthenticated(status) &&
      !absl::IsPermissionDenied(status) && !absl::IsNotFound(status) &&
      !absl::IsInvalidArgument(status)) {
    Fail(absl::StrCat(where, "answered 500: ", status.ToString()));
  }
  const std::string text = body.ok() ? *body : std::string(status.message());
  for (const std::string& secret : {std::string(kAdminToken), w.token_of.at("train"),
                                    w.token_of.at("big"), w.revoked}) {
    if (absl::StrContains(text, secret) && !absl::StrContains(input, secret)) {
      Fail(absl::StrCat(where, "the answer shows a token: ", absl::CEscape(text)));
    }
  }

  if (route->path == "/") {
    if (!body.ok() || *body != kStatusPageHtml) Fail(absl::StrCat(where, "no page"));
    return;
  }
  const auto id = seen.params.find("id");
  if (route->path == "/api/job" && id == seen.params.end()) {
    if (!absl::IsInvalidArgument(status)) Fail(absl::StrCat(where, "not 400 without id"));
    return;
  }
  if (!known) {
    if (!absl::IsUnauthenticated(status)) Fail(absl::StrCat(where, "not 401"));
    return;
  }
  if (absl::IsUnauthenticated(status)) Fail(absl::StrCat(where, "401 for a known token"));
  if (route->path == "/metrics") {
    if (!admin) {
      if (!absl::IsPermissionDenied(status)) Fail(absl::StrCat(where, "not 403"));
      return;
    }
    std::string why;
    if (!body.ok() || !IsPrometheusText(*body, &why)) {
      Fail(absl::StrCat(where, "not Prometheus text: ",
                        body.ok() ? why : status.ToString()));
    }
    return;
  }
  if (route->path == "/api/job" && !admin && id->second != job) {
    if (!absl::IsPermissionDenied(status)) Fail(absl::StrCat(where, "not 403"));
    return;
  }
  if (!body.ok()) {
    if (route->path == "/api/jobs") Fail(absl::StrCat(where, status.ToString()));
    return;  // a job id, query or job that is not there: 400 or 404
  }
  const nlohmann::json json = nlohmann::json::parse(*body, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    Fail(absl::StrCat(where, "not a JSON object: ", absl::CEscape(*body)));
  }
  if (route->path == "/api/job") {
    const auto config = json.find("config");
    if (config == json.end() || !config->is_object() ||
        config->value("job_id", std::string()) != id->second) {
      Fail(absl::StrCat(where, "not job ", id->second, ": ", *body));
    }
    return;
  }
  const auto jobs = json.find("jobs");
  if (jobs == json.end() || !jobs->is_array()) Fail(absl::StrCat(where, "no jobs: ", *body));
  size_t visible = 0;
  for (const v1::JobStatus& j : w.coordinator.jobs().List()) {
    if (admin || j.config().job_id() == job) ++visible;
  }
  if (jobs->size() != visible) {
    Fail(absl::StrCat(where, jobs->size(), " jobs listed, ", visible, " visible"));
  }
  for (const nlohmann::json& j : *jobs) {
    if (!j.is_object() || !j.contains("config") || !j["config"].is_object() ||
        (!admin && j["config"].value("job_id", std::string()) != job)) {
      Fail(absl::StrCat(where, "lists a job it may not see: ", j.dump()));
    }
  }
}

template <typename Message>
bool Parse(const uint8_t* data, size_t size, Message* out) {
  return out->ParseFromArray(data, static_cast<int>(size));
}

// Applies one record of kind `kind`.
void Apply(World& w, uint8_t kind, const uint8_t* data, size_t size,
           const std::string& input) {
  switch (kind % 8) {
    case 4: {  // a process joins
      v1::JoinRequest r;
      if (Parse(data, size, &r)) w.Join(r);
      break;
    }
    case 5: {  // a node's heartbeats, on one stream
      v1::NodeHeartbeatRequest r;
      if (!Parse(data, size, &r)) break;
      auto session = HealthManager::NewSession();
      for (v1::HeartbeatRequest& h : *r.mutable_heartbeats()) {
        v1::HeartbeatResponse response;
        w.coordinator.health().Heartbeat(session.get(), &h, &response).status().IgnoreError();
      }
      break;
    }
    case 6: {  // a member reports its end
      v1::ReportCompletionRequest r;
      if (Parse(data, size, &r)) {
        w.coordinator.health().ReportCompletion(r).status().IgnoreError();
      }
      break;
    }
    case 7: {  // time passes
      w.clock.Advance(absl::Milliseconds(size > 0 ? data[0] * 250 : 1000));
      w.Poll();
      break;
    }
    default: {  // GET: [who][target]['\n' Authorization header, for who 5]
      if (size < 1) break;
      const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
      const size_t newline = rest.find('\n');
      const std::string target = rest.substr(0, newline);
      std::string header;
      switch (data[0] % 6) {
        case 0: Send(w, target, nullptr, input); return;
        case 1: header = absl::StrCat("Bearer ", kAdminToken); break;
        case 2: header = absl::StrCat("Bearer ", w.token_of.at("train")); break;
        case 3: header = absl::StrCat("Bearer ", w.token_of.at("big")); break;
        case 4: header = absl::StrCat("Bearer ", w.revoked); break;
        default: header = newline == std::string::npos ? "" : rest.substr(newline + 1);
      }
      Send(w, target, &header, input);
      break;
    }
  }
}

}  // namespace
}  // namespace gradsync

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  gradsync::SetMinLogSeverity(gradsync::LogSeverity::kFatal);
  // Requests with strings that are not UTF-8 are refused by the parser as
  // by the gRPC layer; protobuf would log each.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  World w;
  const std::string input(reinterpret_cast<const char*>(data), size);
  size_t at = 0;
  while (at + 2 <= size) {
    const uint8_t kind = data[at];
    const size_t length = std::min<size_t>(data[at + 1], size - at - 2);
    Apply(w, kind, data + at + 2, length, input);
    at += 2 + length;
  }
  return 0;
}
