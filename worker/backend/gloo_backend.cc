#include "worker/backend/gloo_backend.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <netdb.h>
#include <pthread.h>
#include <unistd.h>
#include <typeinfo>
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "worker/backend/abortable_gloo_context.h"
#include "worker/backend/reduction.h"

// Debian's libgloo-dev ships gloo/transport/tcp/pair.h without the
// gloo/common/memory.h it includes, so that header does not compile. The one
// member Abort() needs from it is a plain (non-virtual) function that libgloo
// exports; it is declared here as in that header. The class is never
// constructed, destroyed or used for RTTI here: Abort() checks the pair's
// real type with typeid before the cast.
namespace gloo {
namespace transport {
namespace tcp {
class Pair : public ::gloo::transport::Pair {
 public:
  std::exception_ptr signalExceptionExternal(const std::string& msg);
};
}  // namespace tcp
}  // namespace transport
}  // namespace gloo

namespace gradsync {
namespace reduction {

// Gloo's float16 converts with Gloo's own functions (which differ from ours
// only in the bits of a NaN), for the division of an average.
template <>
struct HalfFloat<gloo::float16> {
  static constexpr bool kIsHalf = true;
  static float ToFloat(gloo::float16 h) { return gloo::cpu_half2float(h); }
  static gloo::float16 FromFloat(float f) { return gloo::cpu_float2half_rn(f); }
};

}  // namespace reduction

namespace {

// Gloo waits with std::condition_variable::wait_for, which overflows on
// durations near the maximum; an infinite timeout becomes a year.
constexpr absl::Duration kLongestGlooTimeout = absl::Hours(24 * 365);

std::chrono::milliseconds ToGlooTimeout(absl::Duration timeout) {
  timeout = std::min(timeout, kLongestGlooTimeout);
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
}

// Gloo writes to its sockets without MSG_NOSIGNAL, so a write to a peer that
// has died raises SIGPIPE, whose default action kills the whole process.
// Rather than change the process's disposition, the threads that write on
// Gloo's sockets block it, and the write fails with EPIPE, which Gloo
// reports as an IoException. Those threads are: the one running Create
// (connecting), Gloo's event loop (started by CreateDevice, so it inherits
// the creating thread's mask) and the backend's own thread.
void BlockSigpipeInThisThread(sigset_t* previous_mask) {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, previous_mask);
}

// Blocks SIGPIPE in this thread for its lifetime; on the way out, discards a
// SIGPIPE raised meanwhile (one that was pending before is left alone), then
// restores the thread's mask.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    BlockSigpipeInThisThread(&previous_mask_);
  }
  ~ScopedSigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec no_wait = {0, 0};
      sigtimedwait(&pipe, nullptr, &no_wait);
    }
    pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  bool was_pending_ = false;
  sigset_t previous_mask_;
};

// A Store error, carried through Gloo's rendezvous code as an exception (its
// Store interface has no other way to fail) and turned back into the status
// by GlooBackend::Create.
class StoreError : public gloo::Exception {
 public:
  explicit StoreError(absl::Status status)
      : gloo::Exception(status.ToString()), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Our Store seen as Gloo's rendezvous store. Gloo's get must block until the
// key exists, so it waits up to the backend's timeout. Used only during
// bootstrap, by one thread; `store` must outlive it.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(gradsync::Store* store, absl::Duration timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status status =
        store_->Set(key, std::string(data.begin(), data.end()));
    if (!status.ok()) throw StoreError(Annotate(status, "set", key));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_->Get(key, timeout_);
    if (!value.ok()) throw StoreError(Annotate(value.status(), "get", key));
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    WaitFor(keys, timeout_);
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    // Gloo's "no timeout" is zero; ours is then the backend's.
    WaitFor(keys,
            timeout == gloo::kNoTimeout ? timeout_ : absl::FromChrono(timeout));
  }

 private:
  void WaitFor(const std::vector<std::string>& keys, absl::Duration timeout) {
    absl::Status status = store_->Wait(keys, timeout);
    if (!status.ok()) {
      throw StoreError(Annotate(status, "wait for",
                                keys.size() == 1 ? keys[0] : "several keys"));
    }
  }

  static absl::Status Annotate(const absl::Status& status, const char* verb,
                               const std::string& key) {
    return absl::Status(status.code(),
                        absl::StrCat("store ", verb, " '", key,
                                     "' failed: ", status.message()));
  }

  gradsync::Store* const store_;
  const absl::Duration timeout_;
};

// Maps the exception being handled (call only inside a catch block) to a
// status whose message starts with `where`. Gloo reports timeouts and broken
// connections as IoException; only its message tells them apart.
absl::Status StatusFromCurrentException(const std::string& where,
                                        absl::Duration timeout) {
  try {
    throw;
  } catch (const StoreError& e) {
    return absl::Status(e.status().code(),
                        absl::StrCat(where, ": ", e.status().message()));
  } catch (const gloo::IoException& e) {
    const std::string message = e.what();
    if (absl::StrContains(message, kGlooAbortedMessage)) {
      return absl::UnavailableError(
          absl::StrCat(where, ": ", kGlooAbortedMessage, " on this rank"));
    }
    const std::string lower = absl::AsciiStrToLower(message);
    if (absl::StrContains(lower, "timed out") ||
        absl::StrContains(lower, "timeout")) {
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": ", message, " (a peer did not take part within ",
          absl::FormatDuration(timeout),
          ": check that every rank issues the same collectives in the same "
          "order and is alive)"));
    }
    return absl::UnavailableError(absl::StrCat(
        where, ": ", message,
        " (a peer's connection broke: it died, timed out or shut its backend "
        "down)"));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(where, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(where, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(
        absl::StrCat(where, ": an exception that is not a std::exception"));
  }
}

// Calls `f` with a value of the C++ type Gloo reduces `dtype` as: the
// shared one (reduction.h), except that float16 is Gloo's own, which
// gloo::sum adds. bfloat16 moves as two bytes, summed through float
// (Debian's Gloo has no bfloat16 of its own).
template <typename F>
void VisitReducible(DataType dtype, F&& f) {
  reduction::VisitDataType(dtype, [&](auto zero) {
    if constexpr (std::is_same_v<decltype(zero), reduction::Float16Bits>) {
      f(gloo::float16{});
    } else {
      f(zero);
    }
  });
}

// Gloo's reduce function for T: out = a + b, where out may be a or b.
template <typename T>
void SumInto(void* out, const void* a, const void* b, size_t n) {
  if constexpr (std::is_same_v<T, reduction::BFloat16Bits>) {
    reduction::AddThroughFloat(static_cast<T*>(out), static_cast<const T*>(a),
                               static_cast<const T*>(b), n);
  } else {
    gloo::sum<T>(out, a, b, n);
  }
}

// The name Gloo's device binds: `gloo_options.hostname`, or this machine's
// name when that is empty (Gloo looks it up the same way).
std::string BindName(const GlooOptions& gloo_options) {
  if (!gloo_options.hostname.empty()) return gloo_options.hostname;
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// Gloo resolves the name itself and reads the lookup's result unchecked when
// the name does not resolve (Debian 12's and 13's Gloo crash in
// CreateDeviceAttr): the lookup it will make, first, for a clear error.
absl::Status CheckResolves(const std::string& name) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int error = ::getaddrinfo(name.c_str(), nullptr, &hints, &result);
  if (error != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the name does not resolve: ", ::gai_strerror(error)));
  }
  ::freeaddrinfo(result);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooBackend>> GlooBackend::Create(
    const BackendOptions& options, Store* store, GlooOptions gloo_options) {
  absl::Status valid = CheckBackendOptions(options, "gloo backend");
  if (!valid.ok()) return valid;
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        "gloo backend: no store to bootstrap through");
  }
  const std::string where = absl::StrCat("gloo bootstrap (rank ", options.rank,
                                         " of ", options.world_size, ")");
  const bool by_interface = !gloo_options.network_interface.empty();
  const std::string name = BindName(gloo_options);
  const std::string address =
      by_interface
          ? absl::StrCat("interface '", gloo_options.network_interface, "'")
          : absl::StrCat(gloo_options.hostname.empty() ? "this machine's name '"
                                                       : "host '",
                         name, "'");
  if (!by_interface) {
    absl::Status resolves = CheckResolves(name);
    if (!resolves.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": cannot listen on ", address, ": ", resolves.message(),
          " (pass an address or interface of this machine)"));
    }
  }

  // Held until the backend (and its thread) exist: see ScopedSigpipeBlock.
  ScopedSigpipeBlock block_sigpipe;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    if (by_interface) {
      attr.iface = gloo_options.network_interface;
    } else {
      attr.hostname = name;
    }
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": cannot listen on ", address, ": ", e.what(),
                     " (pass an address or interface of this machine)"));
  }

  const std::chrono::milliseconds gloo_timeout = ToGlooTimeout(options.timeout);
  auto context = std::make_shared<AbortableGlooContext>(options.rank,
                                                        options.world_size);
  context->setTimeout(gloo_timeout);
  GlooStoreAdapter adapter(store, options.timeout);
  try {
    context->ConnectFullMesh(adapter, device);
  } catch (...) {
    return StatusFromCurrentException(where, options.timeout);
  }
  return std::unique_ptr<GlooBackend>(
      new GlooBackend(options, std::move(context)));
}

GlooBackend::GlooBackend(const BackendOptions& options,
                         std::shared_ptr<AbortableGlooContext> context)
    : Backend(options),
      gloo_timeout_(ToGlooTimeout(options.timeout)),
      context_(std::move(context)),
      queue_("gloo", options.rank, options.world_size, [] {
        BlockSigpipeInThisThread(nullptr);  // for good: see ScopedSigpipeBlock
      }) {}

GlooBackend::~GlooBackend() {
  queue_.Shutdown();
  // context_ goes with the members: its connections close, and peers still
  // in a collective with this rank see them break.
}

std::shared_ptr<Work> GlooBackend::AllReduce(Buffer buffer, ReduceOp op) {
  absl::Status valid = CheckBuffer(buffer, DeviceKind::kCpu, "gloo allreduce");
  if (!valid.ok()) return Work::Done(0, std::move(valid));
  if (buffer.count == 0) return Enqueue("allreduce", nullptr);
  return Enqueue("allreduce", [this, buffer, op](uint32_t tag) {
    VisitReducible(buffer.dtype, [&](auto zero) {
      using T = decltype(zero);
      T* data = static_cast<T*>(buffer.data);
      gloo::AllreduceOptions opts(context_);
      opts.setOutput<T>(data, buffer.count);
      opts.setReduceFunction(&SumInto<T>);
      opts.setTag(tag);
      opts.setTimeout(gloo_timeout_);
      gloo::allreduce(opts);
      if (op == ReduceOp::kAverage) {
        reduction::DivideInPlace(data, buffer.count, world_size());
      }
    });
  });
}

std::shared_ptr<Work> GlooBackend::Broadcast(Buffer buffer, int root) {
  absl::Status valid = CheckBuffer(buffer, DeviceKind::kCpu, "gloo broadcast");
  if (valid.ok()) valid = CheckRoot(root, world_size());
  if (!valid.ok()) return Work::Done(0, std::move(valid));
  if (buffer.count == 0) return Enqueue("broadcast", nullptr);
  // Broadcast copies bytes, whatever the dtype.
  return Enqueue("broadcast", [this, buffer, root](uint32_t tag) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(buffer.data), buffer.bytes());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(gloo_timeout_);
    gloo::broadcast(opts);
  });
}

std::shared_ptr<Work> GlooBackend::AllGather(Buffer input, Buffer output) {
  absl::Status valid =
      CheckBuffer(input, DeviceKind::kCpu, "gloo allgather input");
  if (valid.ok()) {
    valid = CheckBuffer(output, DeviceKind::kCpu, "gloo allgather output");
  }
  if (valid.ok()) valid = CheckAllGatherSizes(input, output, world_size());
  if (!valid.ok()) return Work::Done(0, std::move(valid));
  if (input.count == 0) return Enqueue("allgather", nullptr);
  // Allgather copies bytes, whatever the dtype.
  return Enqueue("allgather", [this, input, output](uint32_t tag) {
    gloo::AllgatherOptions opts(context_);
    opts.setInput<uint8_t>(static_cast<uint8_t*>(input.data), input.bytes());
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(output.data), output.bytes());
    opts.setTag(tag);
    opts.setTimeout(gloo_timeout_);
    gloo::allgather(opts);
  });
}

std::shared_ptr<Work> GlooBackend::Barrier() {
  return Enqueue("barrier", [this](uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(gloo_timeout_);
    gloo::barrier(opts);
  });
}

std::shared_ptr<Work> GlooBackend::Enqueue(
    const char* collective, std::function<void(uint32_t tag)> run) {
  if (!run) return queue_.Enqueue(collective, nullptr);
  return queue_.Enqueue(collective,
                        [this, run = std::move(run)](uint64_t sequence,
                                                     const std::string& where) {
                          return Run(run, sequence, where);
                        });
}

void GlooBackend::Abort() {
  // First the waits of the collective in flight (Gloo's own signal below
  // misses a message cut short: AbortableGlooContext).
  context_->AbortWaits();
  // Then the connections: closing one does not wake an operation waiting on
  // it; failing each pair with an exception does (it signals the pair's
  // queued operations, then closes its socket, so peers fail too).
  // "gloo::transport::tcp::Pair", mangled: the pairs of a tcp device.
  static constexpr char kTcpPair[] = "N4gloo9transport3tcp4PairE";
  for (int peer = 0; peer < world_size(); ++peer) {
    if (peer == rank()) continue;
    try {
      gloo::transport::Pair* pair = context_->getPair(peer).get();
      if (pair == nullptr) continue;
      if (std::string(typeid(*pair).name()) != kTcpPair) {
        pair->close();  // another transport: at least close it
        continue;
      }
      static_cast<gloo::transport::tcp::Pair*>(pair)->signalExceptionExternal(
          kGlooAbortedMessage);
    } catch (const std::exception& e) {
      GS_LOG(WARNING) << "gloo rank " << rank() << ": aborting the connection "
                      << "to rank " << peer << ": " << e.what();
    }
  }
}

absl::Status GlooBackend::Run(const std::function<void(uint32_t tag)>& run,
                              uint64_t sequence, const std::string& where) {
  absl::Status status;
  try {
    // Tags keep collectives' messages apart; sequence numbers wrap at 2^32.
    run(static_cast<uint32_t>(sequence));
    return absl::OkStatus();
  } catch (...) {
    status = StatusFromCurrentException(where, options().timeout);
  }
  // Gloo closes every connection itself when an operation times out, but
  // not when one connection breaks: close them all, so that peers waiting
  // on this rank fail now instead of at their timeout. Later collectives
  // fail with ABORTED (SerialOpQueue).
  try {
    context_->closeConnections();
  } catch (const std::exception& e) {
    GS_LOG(WARNING) << where << ": closing gloo connections: " << e.what();
  }
  return status;
}

}  // namespace gradsync
