#include "worker/backend/nccl_faults.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/failpoint.h"
#include "common/logging.h"

namespace gradsync {
namespace {

// What the host functions of injected faults share with the communicator;
// they may run after it is gone.
struct FaultState {
  absl::Mutex mu;
  absl::Status error ABSL_GUARDED_BY(mu);
  bool aborted ABSL_GUARDED_BY(mu) = false;
};

class FaultInjectingComm final : public NcclComm {
 public:
  FaultInjectingComm(std::unique_ptr<NcclComm> inner, NcclDevice* device,
                     CommFaultPlan plan)
      : inner_(std::move(inner)),
        device_(device),
        plan_(std::move(plan)),
        state_(std::make_shared<FaultState>()) {}

  absl::StatusOr<bool> Settled() override {
    {
      absl::MutexLock lock(&state_->mu);
      if (!state_->error.ok()) return state_->error;
    }
    return inner_->Settled();
  }

  void Abort() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->aborted = true;  // ends an injected hang
    }
    inner_->Abort();
  }

  absl::Status AllReduce(const void* send, void* recv, size_t count,
                         DataType dtype, ReduceOp op, void* stream) override {
    return Issue(stream, [&] {
      return inner_->AllReduce(send, recv, count, dtype, op, stream);
    });
  }
  absl::Status Broadcast(const void* send, void* recv, size_t count,
                         DataType dtype, int root, void* stream) override {
    return Issue(stream, [&] {
      return inner_->Broadcast(send, recv, count, dtype, root, stream);
    });
  }
  absl::Status AllGather(const void* send, void* recv, size_t count,
                         DataType dtype, void* stream) override {
    return Issue(stream, [&] {
      return inner_->AllGather(send, recv, count, dtype, stream);
    });
  }

 private:
  // Issues the next collective with its planned fault: `issue` enqueues it
  // on the inner communicator.
  absl::Status Issue(void* stream, const std::function<absl::Status()>& issue) {
    const uint64_t n = ++issued_;
    const CommFault fault = plan_ ? plan_(n) : CommFault();
    std::shared_ptr<FaultState> state = state_;
    switch (fault.kind) {
      case CommFault::Kind::kNone:
        return issue();
      case CommFault::Kind::kDelay: {
        const absl::Duration delay = fault.delay;
        absl::Status delayed = device_->LaunchHostFunction(
            stream, [delay] { absl::SleepFor(delay); });
        if (!delayed.ok()) return delayed;
        return issue();
      }
      case CommFault::Kind::kAsyncError:
        GS_LOG(WARNING) << "injecting an asynchronous error into collective #"
                        << n << " of this communicator";
        return device_->LaunchHostFunction(stream, [state, n] {
          absl::MutexLock lock(&state->mu);
          if (state->error.ok()) {
            state->error = absl::UnavailableError(absl::StrCat(
                "injected asynchronous error in collective #", n,
                " (failpoint or test)"));
          }
        });
      case CommFault::Kind::kHang:
        GS_LOG(WARNING) << "injecting a hang into collective #" << n
                        << " of this communicator";
        return device_->LaunchHostFunction(stream, [state] {
          absl::MutexLock lock(&state->mu);
          state->mu.Await(absl::Condition(&state->aborted));
        });
    }
    return issue();
  }

  const std::unique_ptr<NcclComm> inner_;
  NcclDevice* const device_;
  const CommFaultPlan plan_;
  const std::shared_ptr<FaultState> state_;
  // Collectives issued so far; issuing is serialized by the caller.
  uint64_t issued_ = 0;
};

}  // namespace

std::unique_ptr<NcclComm> InjectCommFaults(std::unique_ptr<NcclComm> comm,
                                           NcclDevice* device,
                                           CommFaultPlan plan) {
  return std::make_unique<FaultInjectingComm>(std::move(comm), device,
                                              std::move(plan));
}

CommFaultPlan FailpointCommFaults() {
  if (!FailpointArmed(kFailpointNcclAsyncError) &&
      !FailpointArmed(kFailpointNcclHang)) {
    return nullptr;
  }
  return [](uint64_t) {
    // Both passes always happen: neither failpoint's count may depend on
    // whether the other fired.
    const bool async_error = FailpointFires(kFailpointNcclAsyncError);
    const bool hang = FailpointFires(kFailpointNcclHang);
    CommFault fault;
    if (async_error) {
      fault.kind = CommFault::Kind::kAsyncError;
    } else if (hang) {
      fault.kind = CommFault::Kind::kHang;
    }
    return fault;
  };
}

}  // namespace gradsync
