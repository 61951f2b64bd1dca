// A Backend for tests whose collectives complete when the test says so:
// Works numbered 1, 2, ... in issue order, kept in `works` for the test to
// Finish(); INVALID_ARGUMENT (sequence 0) for buffers without data, as real
// backends refuse them; Abort() only counts (from any thread). Otherwise
// not thread-safe: the test's thread issues and finishes.
#ifndef GRADSYNC_TESTS_TESTING_SCRIPTED_BACKEND_H_
#define GRADSYNC_TESTS_TESTING_SCRIPTED_BACKEND_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "worker/backend/backend.h"

namespace gradsync {
namespace testing {

class ScriptedBackend final : public Backend {
 public:
  ScriptedBackend() : Backend(BackendOptions()) {}
  std::string name() const override { return "scripted"; }
  std::shared_ptr<Work> AllReduce(Buffer buffer, ReduceOp) override {
    return Issue(buffer);
  }
  std::shared_ptr<Work> Broadcast(Buffer buffer, int) override {
    return Issue(buffer);
  }
  std::shared_ptr<Work> AllGather(Buffer input, Buffer) override {
    return Issue(input);
  }
  std::shared_ptr<Work> Barrier() override {
    works.push_back(std::make_shared<Work>(works.size() + 1));
    return works.back();
  }
  void Abort() override { ++aborts; }
  std::atomic<int> aborts{0};
  std::vector<std::shared_ptr<Work>> works;

 private:
  std::shared_ptr<Work> Issue(const Buffer& buffer) {
    if (buffer.data == nullptr && buffer.count > 0) {
      return Work::Done(0, absl::InvalidArgumentError("no data"));
    }
    works.push_back(std::make_shared<Work>(works.size() + 1));
    return works.back();
  }
};

}  // namespace testing
}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_SCRIPTED_BACKEND_H_
