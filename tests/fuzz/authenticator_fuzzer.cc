// libFuzzer harness of the coordinator's Authenticator (--auth=token): the
// admin's token read from its file as --admin_token_file is read, job tokens
// issued and re-issued as CreateJob does, then presented as
// `authorization` metadata values (none, exact, mangled or arbitrary), the
// callers found checked against jobs (Authorize), and restarts that reload
// the token hashes from storage. A model of which token is valid for whom
// gives every answer: a token is the admin's or the current one of exactly
// one job, anything else is UNAUTHENTICATED, and a restart changes nothing.
// Errors must not depend on the token presented (so they cannot reveal it).
// The sanitizers (address, undefined) watch the rest.
//
// Input: records of [kind byte][length byte][length bytes]. The first record
// is the admin token file's contents (kind odd: --auth=none instead); the
// others are applied in order (see Apply). tests/fuzz/run.sh builds and runs
// it.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/escaping.h"
#include "common/job_config.h"
#include "common/token_file.h"
#include "server/authenticator.h"
#include "server/storage/in_memory_storage.h"

namespace gradsync {
namespace {

constexpr char kBearer[] = "Bearer ";
// Jobs a record names when its bytes are no job id.
const char* const kJobs[] = {"a", "b", "train-7", "x"};

// A failed expectation: what the harness found, then abort() (libFuzzer
// keeps the input).
[[noreturn]] void Fail(const std::string& what) {
  fprintf(stderr, "authenticator_fuzzer: %s\n", what.c_str());
  std::abort();
}

// A file holding `contents` for as long as this lives, without touching the
// disk: a memfd, named by its /proc/self/fd path.
class MemoryFile {
 public:
  explicit MemoryFile(const std::string& contents)
      : fd_(memfd_create("token", 0)) {
    if (fd_ < 0 || write(fd_, contents.data(), contents.size()) !=
                       static_cast<ssize_t>(contents.size())) {
      Fail("cannot make a memfd");
    }
  }
  ~MemoryFile() { close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  std::string path() const { return absl::StrCat("/proc/self/fd/", fd_); }

 private:
  const int fd_;
};

// The tokens valid now, and what Identify must answer for a header.
struct Model {
  std::string admin;                            // "": --auth=none
  std::map<std::string, std::string> token_of;  // job -> its current token
  std::vector<std::string> revoked;             // replaced tokens

  enum class Answer { kAdmin, kJob, kMissing, kMalformed, kUnknown };
  // What a call with `header` (nullptr: no metadata) is; for kJob, `job`.
  Answer Expected(const std::string* header, std::string* job) const {
    if (admin.empty()) return Answer::kAdmin;
    if (header == nullptr) return Answer::kMissing;
    if (!absl::StartsWith(*header, kBearer) ||
        header->size() == sizeof(kBearer) - 1) {
      return Answer::kMalformed;
    }
    const std::string token = header->substr(sizeof(kBearer) - 1);
    if (token == admin) return Answer::kAdmin;
    for (const auto& [j, t] : token_of) {
      if (token == t) {
        *job = j;
        return Answer::kJob;
      }
    }
    return Answer::kUnknown;
  }

  // Every token that is or was valid, the admin's first.
  std::vector<std::string> Secrets() const {
    std::vector<std::string> all = {admin};
    for (const auto& [job, token] : token_of) all.push_back(token);
    all.insert(all.end(), revoked.begin(), revoked.end());
    return all;
  }
};

struct World {
  InMemoryStorage storage;
  Model model;
  std::unique_ptr<Authenticator> auth;

  // A restart: a new Authenticator loads the hashes kept in storage.
  void Restart() {
    auth = std::make_unique<Authenticator>(&storage, model.admin);
    absl::Status loaded = auth->LoadFromStorage();
    if (!loaded.ok()) Fail(absl::StrCat("LoadFromStorage: ", loaded.ToString()));
    if (auth->enabled() != !model.admin.empty()) Fail("enabled() is wrong");
  }
};

// Identify(header) must give the model's answer; its errors must be the
// same for every header of their kind.
absl::StatusOr<Caller> CheckIdentify(World& w, const std::string* header) {
  std::string job;
  const Model::Answer expected = w.model.Expected(header, &job);
  absl::StatusOr<Caller> caller = w.auth->Identify(header);
  const std::string shown = header == nullptr ? "(none)" : absl::CEscape(*header);
  switch (expected) {
    case Model::Answer::kAdmin:
      if (!caller.ok() || !caller->admin) {
        Fail(absl::StrCat("header ", shown, " is the admin's, got ",
                          caller.ok() ? "a job's caller" : caller.status().ToString()));
      }
      return caller;
    case Model::Answer::kJob:
      if (!caller.ok() || caller->admin || caller->job_id != job) {
        Fail(absl::StrCat("header ", shown, " is job '", job, "''s, got ",
                          caller.ok() ? absl::StrCat("caller '", caller->job_id, "'")
                                      : caller.status().ToString()));
      }
      return caller;
    default:
      break;
  }
  if (!absl::IsUnauthenticated(caller.status())) {
    Fail(absl::StrCat("header ", shown, " must be UNAUTHENTICATED, got ",
                      caller.ok() ? "a caller" : caller.status().ToString()));
  }
  // The message of a header of the same kind with another token (one that
  // no file or IssueToken can give: it holds spaces): equal, so nothing of
  // the token shows.
  if (expected != Model::Answer::kMissing) {
    const std::string other = expected == Model::Answer::kMalformed
                                  ? std::string("Basic x")
                                  : std::string("Bearer not a token");
    absl::StatusOr<Caller> same = w.auth->Identify(&other);
    if (same.status() != caller.status()) {
      Fail(absl::StrCat("header ", shown, " is refused with '",
                        caller.status().ToString(), "', another of its kind with '",
                        same.status().ToString(), "'"));
    }
  }
  return caller;
}

// `token` presented in one of several right and wrong ways (`how`).
std::string Present(const std::string& token, uint8_t how, const uint8_t* rest,
                    size_t rest_size) {
  const uint8_t at = rest_size > 0 ? rest[0] : 0;
  const char c = rest_size > 1 ? static_cast<char>(rest[1]) : 'x';
  std::string mangled = token;
  switch (how % 12) {
    case 0: return absl::StrCat(kBearer, token);
    case 1: return absl::StrCat("bearer ", token);
    case 2: return absl::StrCat("Bearer  ", token);
    case 3: return absl::StrCat(kBearer, token, " ");
    case 4: return absl::StrCat(kBearer, token.substr(0, token.size() - 1));
    case 5: return absl::StrCat(kBearer, token, std::string(1, c));
    case 6:
      if (!mangled.empty()) {
        char& x = mangled[at % mangled.size()];
        x = absl::ascii_isupper(x) ? absl::ascii_tolower(x) : absl::ascii_toupper(x);
      }
      return absl::StrCat(kBearer, mangled);
    case 7: return token;
    case 8:
      if (!mangled.empty()) mangled[at % mangled.size()] = c;
      return absl::StrCat(kBearer, mangled);
    case 9: return absl::StrCat("Basic ", token);
    case 10: return absl::StrCat("Bearer\t", token);
    default: return absl::StrCat(kBearer, token, std::string(1, '\0'));
  }
}

// ReadTokenFile and AdminToken as main() calls them for --auth=`mode` and a
// token file holding `contents` (none when `with_file` is false).
absl::StatusOr<std::string> CheckAdminToken(const std::string& mode,
                                            bool with_file,
                                            const std::string& contents) {
  MemoryFile file(contents);
  const std::string path = with_file ? file.path() : "";
  absl::StatusOr<std::string> token = AdminToken(mode, path);
  const bool wants_file = mode == "token";
  if (mode != "none" && mode != "token") {
    if (!absl::IsInvalidArgument(token.status())) Fail("an unknown --auth mode is accepted");
    return token;
  }
  if (wants_file != with_file) {
    if (!absl::IsInvalidArgument(token.status())) {
      Fail(absl::StrCat("--auth=", mode, (with_file ? " with" : " without"),
                        " a token file is accepted"));
    }
    return token;
  }
  if (!wants_file) {
    if (!token.ok() || !token->empty()) Fail("--auth=none gives a token");
    return token;
  }
  // The token is the file's one word, surrounding whitespace dropped.
  const std::string word(absl::StripAsciiWhitespace(contents));
  const bool one_word =
      !word.empty() && std::none_of(word.begin(), word.end(), [](char ch) {
        return absl::ascii_isspace(static_cast<unsigned char>(ch));
      });
  if (one_word != token.ok() || (token.ok() && *token != word)) {
    Fail(absl::StrCat("token file '", absl::CEscape(contents), "' read as ",
                      token.ok() ? absl::CEscape(*token) : token.status().ToString()));
  }
  if (!token.ok()) {
    // A file of the same shape with other characters is refused alike: the
    // message holds nothing of the file.
    std::string shape = contents;
    for (char& ch : shape) {
      if (!absl::ascii_isspace(static_cast<unsigned char>(ch))) ch = 'x';
    }
    MemoryFile other(shape);
    absl::StatusOr<std::string> same = ReadTokenFile(other.path(), "--admin_token_file");
    const std::string message(token.status().message());
    const std::string expected =
        absl::StrReplaceAll(std::string(same.status().message()),
                            {{other.path(), file.path()}});
    if (same.status().code() != token.status().code() || message != expected) {
      Fail(absl::StrCat("token file '", absl::CEscape(contents), "' refused with '",
                        message, "', one of its shape with '", expected, "'"));
    }
  }
  return token;
}

// Applies one record of kind `kind`.
void Apply(World& w, uint8_t kind, const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  switch (kind % 8) {
    case 0: {  // the admin creates a job (again): its token is (re)issued
      const std::string job = ValidateJobId(bytes).ok()
                                  ? bytes
                                  : kJobs[size > 0 ? data[0] % 4 : 0];
      absl::StatusOr<std::string> token = w.auth->IssueToken(job);
      if (w.model.admin.empty()) {
        if (!absl::IsFailedPrecondition(token.status())) {
          Fail("a token is issued with --auth=none");
        }
        return;
      }
      if (!token.ok()) Fail(absl::StrCat("IssueToken: ", token.status().ToString()));
      if (token->size() != 64 ||
          !std::all_of(token->begin(), token->end(), [](char c) {
            return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
          })) {
        Fail(absl::StrCat("token '", *token, "' is not 64 hex digits"));
      }
      for (const std::string& secret : w.model.Secrets()) {
        if (*token == secret) Fail("a token is issued twice");
      }
      auto old = w.model.token_of.find(job);
      if (old != w.model.token_of.end()) w.model.revoked.push_back(old->second);
      w.model.token_of[job] = *token;
      return;
    }
    case 1:
    case 2: {  // arbitrary metadata
      (void)CheckIdentify(w, &bytes);  // it checks the answer itself
      return;
    }
    case 3: {  // a known token, presented right or wrong
      if (size < 2) return;
      const std::vector<std::string> secrets = w.model.Secrets();
      const std::string header =
          Present(secrets[data[0] % secrets.size()], data[1], data + 2, size - 2);
      (void)CheckIdentify(w, &header);  // it checks the answer itself
      return;
    }
    case 4: {  // no metadata
      (void)CheckIdentify(w, nullptr);  // it checks the answer itself
      return;
    }
    case 5: {  // a caller (the first byte picks its token) acts in a job
      if (size < 1) return;
      const std::vector<std::string> secrets = w.model.Secrets();
      const std::string header = absl::StrCat(kBearer, secrets[data[0] % secrets.size()]);
      absl::StatusOr<Caller> caller = CheckIdentify(w, &header);
      if (!caller.ok()) return;
      const std::string job = bytes.substr(1);
      absl::Status allowed = Authenticator::Authorize(*caller, job);
      const bool may = caller->admin || caller->job_id == job;
      if (may != allowed.ok() || (!may && !absl::IsPermissionDenied(allowed))) {
        Fail(absl::StrCat("caller '", caller->job_id, "' (admin ", caller->admin,
                          ") in job '", absl::CEscape(job), "': ", allowed.ToString()));
      }
      // The refusal names the caller's job and the job asked for (ids, not
      // secrets); with them taken out no token may show. (A job id ending
      // like a token, then the message's closing quote, once looked like
      // one; so did a job named like the admin's token.)
      std::string refusal(allowed.message());
      for (const std::string& id : {job, caller->job_id}) {
        if (!id.empty()) refusal = absl::StrReplaceAll(refusal, {{id, "<job>"}});
      }
      for (const std::string& secret : secrets) {
        if (secret.size() >= 8 && absl::StrContains(refusal, secret)) {
          Fail(absl::StrCat("a refusal shows the token '", absl::CEscape(secret),
                            "': ", allowed.ToString()));
        }
      }
      return;
    }
    case 6: {  // the coordinator restarts
      w.Restart();
      return;
    }
    default: {  // --auth and --admin_token_file as main() reads them
      const size_t end = std::min(bytes.find('\0'), bytes.size());
      CheckAdminToken(bytes.substr(0, end), end < bytes.size(),
                      end < bytes.size() ? bytes.substr(end + 1) : "")
          .IgnoreError();
      return;
    }
  }
}

}  // namespace
}  // namespace gradsync

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  World w;
  size_t at = 0;
  bool first = true;
  while (at + 2 <= size) {
    const uint8_t kind = data[at];
    const size_t length = std::min<size_t>(data[at + 1], size - at - 2);
    if (first) {
      // The admin's token, from its file; a file main() would refuse
      // leaves a fixed one.
      const std::string contents(reinterpret_cast<const char*>(data + at + 2), length);
      absl::StatusOr<std::string> admin =
          CheckAdminToken(kind % 2 == 0 ? "token" : "none", kind % 2 == 0, contents);
      w.model.admin = admin.ok() ? *admin : "fallback-admin-token";
      w.Restart();
      first = false;
    } else {
      Apply(w, kind, data + at + 2, length);
    }
    at += 2 + length;
  }
  return 0;
}
