#include "worker/launch/process_stacks.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "worker/runtime/thread_stacks.h"

namespace gradsync {
namespace {

constexpr char kMarker[] = "gradsync-stacks pid=";
constexpr int kMaxFrames = 48;
constexpr int kMaxThreads = 128;
constexpr size_t kMaxFrameChars = 200;
// How a dump is known complete: its file stopped growing for this long.
constexpr absl::Duration kQuiet = absl::Milliseconds(30);
constexpr absl::Duration kPoll = absl::Milliseconds(10);
// How many parents up a registered process may be from the one started
// (a shell or wrapper between them).
constexpr int kMaxDepth = 8;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// The pid of `pid`'s parent, from /proc/PID/stat; 0 when unknown.
pid_t ParentOf(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  // "PID (comm) S PPID ...": comm may hold spaces and parentheses.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ',
                     absl::SkipEmpty());
  int parent = 0;
  return fields.size() > 1 && absl::SimpleAtoi(fields[1], &parent) ? parent : 0;
}

// Whether `registered` is `pid` or one of its descendants.
bool InTree(pid_t registered, pid_t pid) {
  for (int depth = 0; depth <= kMaxDepth && registered > 1; ++depth) {
    if (registered == pid) return true;
    registered = ParentOf(registered);
  }
  return false;
}

// The pid that registered in `stacks_file`; 0 when none did.
pid_t Registered(const std::string& stacks_file) {
  std::ifstream in(stacks_file);
  std::string first;
  std::getline(in, first);
  absl::string_view line = first;
  int pid = 0;
  if (!absl::ConsumePrefix(&line, kMarker)) return 0;
  return absl::SimpleAtoi(line.substr(0, line.find(' ')), &pid) ? pid : 0;
}

// Without Python stacks: each thread of `pid` and where the kernel has it
// waiting.
void KernelWaits(pid_t pid, v1::ThreadStacks* out) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = readdir(dir)) {
    int tid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &tid)) continue;
    if (out->threads_size() == kMaxThreads) break;
    const std::string task = absl::StrCat(tasks, "/", tid);
    v1::ThreadStack* thread = out->add_threads();
    thread->set_tid(tid);
    thread->set_name(std::string(
        absl::StripAsciiWhitespace(ReadFile(task + "/comm"))));
    const std::string wchan(
        absl::StripAsciiWhitespace(ReadFile(task + "/wchan")));
    thread->add_frames(wchan.empty() || wchan == "0"
                           ? "[kernel] running or unknown"
                           : absl::StrCat("[kernel] ", wchan));
  }
  closedir(dir);
}

}  // namespace

std::vector<v1::ThreadStack> ParseFaulthandlerDump(absl::string_view dump) {
  std::vector<v1::ThreadStack> threads;
  for (absl::string_view line : absl::StrSplit(dump, '\n')) {
    if (absl::StartsWith(line, "Thread 0x") ||
        absl::StartsWith(line, "Current thread 0x")) {
      if (threads.size() == kMaxThreads) break;
      threads.emplace_back().set_name("python");
      continue;
    }
    // '  File "/path/train.py", line 12 in train_step'
    if (threads.empty() || !absl::ConsumePrefix(&line, "  File \"")) continue;
    const size_t quote = line.find("\", line ");
    const size_t in = line.find(" in ", quote == line.npos ? 0 : quote);
    if (quote == line.npos || in == line.npos) continue;
    absl::string_view file = line.substr(0, quote);
    file = file.substr(file.rfind('/') + 1);  // npos + 1 == 0
    const absl::string_view number =
        line.substr(quote + 8, in - (quote + 8));
    std::string frame = absl::StrCat(line.substr(in + 4), " (", file, ":",
                                     number, ")");
    if (frame.size() > kMaxFrameChars) frame.resize(kMaxFrameChars);
    if (threads.back().frames_size() < kMaxFrames) {
      threads.back().add_frames(std::move(frame));
    }
  }
  return threads;
}

int PythonStacksSignal() { return SIGRTMIN + 6; }

v1::ThreadStacks CaptureProcessStacks(int64_t request, pid_t pid,
                                      const std::string& stacks_file,
                                      absl::Duration timeout, int signal) {
  v1::ThreadStacks out;
  out.set_request(request);
  const pid_t registered = stacks_file.empty() ? 0 : Registered(stacks_file);
  if (registered == 0 || !InTree(registered, pid)) {
    KernelWaits(pid, &out);
    out.set_error(
        "no Python stacks: the process did not register for them "
        "(gradsync.torch.monitor() does); its threads' kernel wait channels "
        "only");
    return out;
  }
  const int64_t before = FileSize(stacks_file);
  if (kill(registered, signal) != 0) {
    out.set_error(absl::StrCat("cannot signal pid ", registered, ": ",
                               strerror(errno)));
    return out;
  }
  // faulthandler writes the dump from its signal handler, at once: wait
  // until the file stops growing.
  const absl::Time deadline = absl::Now() + timeout;
  int64_t size = before;
  absl::Time changed = absl::Now();
  while (absl::Now() < deadline) {
    absl::SleepFor(kPoll);
    const int64_t now_size = FileSize(stacks_file);
    if (now_size != size) {
      size = now_size;
      changed = absl::Now();
    } else if (size > before && absl::Now() - changed >= kQuiet) {
      break;
    }
  }
  if (size <= before) {
    out.set_error(absl::StrCat("pid ", registered, " wrote no stacks within ",
                               absl::FormatDuration(timeout)));
    return out;
  }
  const std::string dump = ReadFile(stacks_file).substr(before);
  for (v1::ThreadStack& t : ParseFaulthandlerDump(dump)) {
    *out.add_threads() = std::move(t);
  }
  return out;
}

}  // namespace gradsync
