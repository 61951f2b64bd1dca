#include "worker/ddp/reducer.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "worker/ddp/tensor_buffer.h"

namespace gradsync {
namespace {

int64_t Bytes(const torch::Tensor& t) { return t.numel() * t.element_size(); }

// Fails the running backward() with `message` (autograd rethrows it).
[[noreturn]] void FailBackward(const std::string& message) {
  TORCH_CHECK(false, "DistributedDataParallel: ", message);
  std::abort();  // TORCH_CHECK(false) always throws
}

}  // namespace

Reducer::Reducer(std::vector<std::string> names,
                 std::vector<torch::Tensor> params, Backend* backend,
                 ReducerOptions options, Clock* clock)
    : names_(std::move(names)),
      params_(std::move(params)),
      backend_(backend),
      options_(options),
      clock_(clock) {
  GS_CHECK(names_.size() == params_.size());
  GS_CHECK(!params_.empty()) << "a Reducer needs parameters";
  {
    absl::MutexLock lock(&mu_);
    hook_ = std::make_shared<AllReduceHook>();
    std::vector<size_t> reverse(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      reverse[i] = params_.size() - 1 - i;
    }
    InitializeBuckets(reverse);
    ready_.assign(params_.size(), false);
    if (options_.gradient_as_bucket_view) PointGradientsAtBuckets();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    grad_accumulators_.push_back(
        AddPostAccumulateHook(params_[i], [this, i] { AutogradHook(i); }));
  }
}

// The hooks capture `this`; a Reducer outlives the backward passes over its
// parameters (the DDP wrapper owns both), so nothing fires after this. A
// step that failed before its buckets were waited for (a parameter without
// a gradient) leaves their collectives on the backend: end them so that
// none writes into a freed bucket.
Reducer::~Reducer() {
  absl::MutexLock lock(&mu_);
  DrainBucketsLocked();
}

void Reducer::DrainBucketsLocked() {
  for (Bucket& bucket : buckets_) {
    if (bucket.future.has_value()) {
      bucket.future->Drain(backend_, options_.timeout);
      bucket.future.reset();
    }
  }
}

absl::Status Reducer::RegisterCommHook(std::shared_ptr<CommHook> hook) {
  if (hook == nullptr) {
    return absl::InvalidArgumentError("the communication hook is null");
  }
  absl::MutexLock lock(&mu_);
  if (hook_registered_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a communication hook (", hook_->name(),
        ") is registered already: register one hook, once"));
  }
  if (synchronized_once_) {
    return absl::FailedPreconditionError(
        "register the communication hook before the first synchronized "
        "backward pass, so that every rank reduces every step the same way");
  }
  hook_ = std::move(hook);
  hook_registered_ = true;
  return absl::OkStatus();
}

std::string Reducer::comm_hook_name() const {
  absl::MutexLock lock(&mu_);
  return hook_->name();
}

void Reducer::CompleteTimingsLocked() {
  StepTimings& t = last_timings_;
  absl::Duration ran;
  absl::Time last_end = absl::InfinitePast();
  for (BucketTiming& b : t.bucket_timings) b.allreduce = absl::ZeroDuration();
  for (const IssuedWork& issued : step_works_) {
    if (!issued.work->IsCompleted()) return;  // not yet known
  }
  for (const IssuedWork& issued : step_works_) {
    const absl::Time started = issued.work->started();
    const absl::Time ended = issued.work->ended();
    if (started == absl::InfiniteFuture() || ended == absl::InfiniteFuture()) {
      continue;  // never ran (it failed before)
    }
    ran += ended - started;
    last_end = std::max(last_end, ended);
    for (BucketTiming& b : t.bucket_timings) {
      if (b.index == static_cast<int>(issued.bucket)) b.allreduce += ended - started;
    }
  }
  t.communication = ran;
  t.exposed_communication =
      last_end == absl::InfinitePast()
          ? absl::ZeroDuration()
          : std::max(absl::ZeroDuration(), last_end - last_hook_wall_);
  t.hidden_communication =
      std::max(absl::ZeroDuration(), t.communication - t.exposed_communication);
}

absl::Status Reducer::CheckStepCollectives() {
  absl::MutexLock lock(&mu_);
  // Every one waited for first (the timings need them all); one still
  // running after the timeout is ended, as the buckets are reused.
  std::vector<absl::Status> statuses;
  for (const IssuedWork& issued : step_works_) {
    statuses.push_back(backend_->Await(*issued.work, options_.timeout));
  }
  CompleteTimingsLocked();
  std::vector<IssuedWork> works = std::move(step_works_);
  step_works_.clear();
  for (size_t i = 0; i < works.size(); ++i) {
    const std::shared_ptr<Work>& work = works[i].work;
    absl::Status status = statuses[i];
    if (status.ok()) continue;
    status = absl::Status(
        status.code(), absl::StrCat("a gradient collective of this step (#",
                                    work->sequence(), ") failed: ",
                                    status.message()));
    if (communication_error_.ok()) communication_error_ = status;
    return status;
  }
  return absl::OkStatus();
}

absl::Status Reducer::communication_error() const {
  absl::MutexLock lock(&mu_);
  return communication_error_;
}

void Reducer::PrepareForBackward(bool sync, absl::Duration forward,
                                 int64_t divisor) {
  absl::MutexLock lock(&mu_);
  communication_error_ = absl::OkStatus();
  // A forward whose backward never ran leaves nothing launched (launches
  // happen in hooks), so starting over is safe.
  std::fill(ready_.begin(), ready_.end(), false);
  // A failed step's record of the order does not count.
  if (!rebuilt_) ready_order_.clear();
  // A failed step's buckets may still be reduced into: not any more.
  DrainBucketsLocked();
  for (Bucket& bucket : buckets_) bucket.pending = bucket.variables.size();
  next_bucket_ = 0;
  prepared_ = true;
  sync_ = sync;
  divisor_ = divisor;
  forward_ = forward;
  backward_start_ = clock_->Now();
  last_hook_ = backward_start_;
  first_launch_ = absl::InfiniteFuture();
}

void Reducer::AutogradHook(size_t variable) {
  bool queue_finalize = false;
  {
    absl::MutexLock lock(&mu_);
    if (!prepared_) {
      FailBackward(absl::StrCat(
          "a backward pass reached parameter ", names_[variable],
          " but no forward pass through the DDP wrapper prepared it, so its "
          "gradients would not be synchronized across ranks: run the forward "
          "pass as ddp->forward(input) or ddp->Forward([&] { ... }), not on "
          "the module directly, and once per backward pass (under NoSync() "
          "to accumulate gradients locally)"));
    }
    if (sync_) {  // no_sync: accumulate locally
      // Only gradients autograd produced define the rebuilt order; unused
      // parameters go last (RebuildBuckets).
      if (!rebuilt_) ready_order_.push_back(variable);
      MarkVariableReady(variable);
    }
    queue_finalize = !finalize_queued_;
    finalize_queued_ = true;
  }
  if (queue_finalize) QueueEndOfBackwardCallback([this] { FinalizeBackward(); });
}

void Reducer::MarkVariableReady(size_t variable) {
  if (ready_[variable]) {
    FailBackward(absl::StrCat(
        "parameter ", names_[variable],
        " got a gradient twice in one step: run one backward per forward "
        "(or use no_sync for accumulation)"));
  }
  ready_[variable] = true;
  last_hook_ = clock_->Now();
  last_hook_wall_ = absl::Now();

  torch::NoGradGuard no_grad;
  const Slot& slot = slots_[variable];
  Bucket& bucket = buckets_[slot.bucket];
  torch::Tensor& view = bucket.views[slot.index];
  const torch::Tensor& param = params_[variable];
  const torch::Tensor& grad = param.grad();
  if (!grad.defined()) {
    view.zero_();
  } else if (!grad.is_same(view)) {
    view.copy_(grad);
  }
  if (options_.gradient_as_bucket_view && !param.grad().is_same(view)) {
    param.mutable_grad() = view;  // from now on autograd writes in place
  }
  if (--bucket.pending == 0) MarkBucketReady();
}

void Reducer::MarkBucketReady() {
  while (next_bucket_ < buckets_.size() &&
         buckets_[next_bucket_].pending == 0) {
    LaunchBucket(next_bucket_, buckets_[next_bucket_].contents);
    ++next_bucket_;
  }
}

void Reducer::LaunchBucket(size_t b, const torch::Tensor& contents) {
  Bucket& bucket = buckets_[b];
  bucket.launched = clock_->Now();
  if (first_launch_ == absl::InfiniteFuture()) first_launch_ = bucket.launched;
  GradBucket grad_bucket;
  grad_bucket.index = b;
  grad_bucket.is_last = b + 1 == buckets_.size();
  grad_bucket.buffer = contents;
  grad_bucket.divisor = divisor_;
  if (contents.is_same(bucket.contents)) {
    grad_bucket.gradients = bucket.views;
  } else {
    int64_t offset = 0;
    for (size_t v : bucket.variables) {
      const torch::Tensor& param = params_[v];
      grad_bucket.gradients.push_back(
          contents.narrow(0, offset, param.numel()).view(param.sizes()));
      offset += param.numel();
    }
  }
  try {
    bucket.future = hook_->Run(backend_, grad_bucket);
  } catch (const c10::Error& e) {
    bucket.future = BucketFuture::Error(absl::InternalError(absl::StrCat(
        "communication hook ", hook_->name(), " failed on bucket ", b, ": ",
        e.what_without_backtrace())));
  }
  bucket.wire_bytes = grad_bucket.wire_bytes;
}

absl::Status Reducer::AwaitBuckets(const std::vector<torch::Tensor>& contents,
                                   StepTimings* timings) {
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    const uint64_t sequence = bucket.future->sequence();
    // On CUDA the caller's stream waits for the collective, not the host.
    absl::StatusOr<torch::Tensor> reduced =
        bucket.future->Wait(options_.timeout, CurrentStream(contents[b]));
    const std::vector<std::shared_ptr<Work>> works = bucket.future->works();
    for (const std::shared_ptr<Work>& work : works) {
      step_works_.push_back({b, work});
    }
    bucket.future.reset();
    absl::Status status = reduced.status();
    if (status.ok() && !reduced->is_same(contents[b])) {
      if (reduced->numel() != contents[b].numel()) {
        status = absl::InternalError(absl::StrCat(
            "communication hook ", hook_->name(), " returned ",
            reduced->numel(), " elements for bucket ", b, " of ",
            contents[b].numel()));
      } else {
        contents[b].copy_(*reduced);
      }
    }
    if (!status.ok()) {
      // A wait that timed out left its collective running: it is ended. One
      // that failed otherwise (a hook's stage, on a device) may still have
      // one running normally: it is waited for first.
      for (const std::shared_ptr<Work>& work : works) {
        if (status.code() == absl::StatusCode::kDeadlineExceeded) {
          backend_->Settle(*work, options_.timeout);
        } else {
          backend_->Await(*work, options_.timeout).IgnoreError();
        }
      }
      DrainBucketsLocked();
      return absl::Status(status.code(),
                          absl::StrCat("all-reduce of gradient bucket ", b,
                                       " of ", buckets_.size(), " failed: ",
                                       status.message()));
    }
    if (timings != nullptr) {
      // The run time comes from the Works (CompleteTimingsLocked).
      timings->bucket_timings.push_back({static_cast<int>(b), bucket.wire_bytes,
                                         sequence, absl::ZeroDuration()});
    }
  }
  return absl::OkStatus();
}

void Reducer::FinalizeBackward() {
  absl::MutexLock lock(&mu_);
  finalize_queued_ = false;
  prepared_ = false;  // the next backward needs a forward through DDP again
  if (!sync_) return;
  sync_ = false;  // this step ends here, whatever happens below
  synchronized_once_ = true;
  std::vector<size_t> unready;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) unready.push_back(i);
  }
  if (!unready.empty()) {
    if (!options_.find_unused_parameters) {
      // Launched buckets are ended at the next step or with the reducer.
      FailBackward(absl::StrCat(
          "parameter(s) ", absl::StrJoin(UnreadyNamesLocked(), ", "),
          " received no gradient in this backward pass: if the model does not "
          "use every parameter in every step, construct it with "
          "find_unused_parameters=true"));
    }
    for (size_t i : unready) MarkVariableReady(i);  // reduced as zeros
  }

  StepTimings timings;
  std::vector<torch::Tensor> contents;
  for (const Bucket& bucket : buckets_) contents.push_back(bucket.contents);
  absl::Status reduced = AwaitBuckets(contents, &timings);
  if (!reduced.ok()) {
    communication_error_ = reduced;
    FailBackward(reduced.ToString());
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Slot& slot = slots_[i];
    const torch::Tensor& view = buckets_[slot.bucket].views[slot.index];
    const torch::Tensor& grad = params_[i].grad();
    if (grad.is_same(view)) continue;
    if (grad.defined()) {
      params_[i].mutable_grad().copy_(view);
    } else {
      params_[i].mutable_grad() = view.clone();
    }
  }

  timings.forward = forward_;
  timings.backward_compute = last_hook_ - backward_start_;
  timings.buckets = static_cast<int>(buckets_.size());
  timings.first_bucket_ready = first_launch_;
  last_timings_ = std::move(timings);
  // A CPU backend's collectives are done by now; a device's are not until
  // CheckStepCollectives, which completes the timings then.
  CompleteTimingsLocked();

  if (!rebuilt_) {
    absl::Status rebuilt = RebuildBuckets();
    if (!rebuilt.ok()) {
      communication_error_ = rebuilt;
      FailBackward(absl::StrCat("rebuilding buckets failed: ",
                                rebuilt.ToString()));
    }
  }
}

absl::Status Reducer::ShadowBackward(int64_t divisor) {
  absl::MutexLock lock(&mu_);
  if (finalize_queued_) {
    return absl::FailedPreconditionError(
        "cannot shadow a backward pass from inside one");
  }
  prepared_ = false;
  sync_ = false;
  synchronized_once_ = true;
  divisor_ = divisor;
  first_launch_ = absl::InfiniteFuture();
  std::vector<torch::Tensor> zeros;
  {
    torch::NoGradGuard no_grad;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      zeros.push_back(torch::zeros_like(buckets_[b].contents));
      LaunchBucket(b, zeros.back());
    }
  }
  absl::Status status = AwaitBuckets(zeros, nullptr);
  std::vector<IssuedWork> works = std::move(step_works_);
  step_works_.clear();
  for (const IssuedWork& issued : works) {  // `zeros` go when this returns
    if (status.ok()) {
      status = backend_->Await(*issued.work, options_.timeout);
    } else {
      backend_->Settle(*issued.work, options_.timeout);
    }
  }
  if (status.ok() && !rebuilt_) status = RebuildBuckets();
  communication_error_ = status;
  return status;
}

void Reducer::InitializeBuckets(const std::vector<size_t>& order) {
  buckets_.clear();
  slots_.assign(params_.size(), Slot());
  // One open bucket per (dtype, device); a bucket closes once it reaches its
  // limit. The first bucket's limit is small so communication starts early.
  std::map<std::pair<int, std::string>, size_t> open;
  std::vector<int64_t> bucket_bytes;
  for (size_t variable : order) {
    const torch::Tensor& param = params_[variable];
    auto key = std::make_pair(static_cast<int>(param.scalar_type()),
                              param.device().str());
    auto it = open.find(key);
    if (it == open.end()) {
      it = open.emplace(key, buckets_.size()).first;
      buckets_.emplace_back();
      bucket_bytes.push_back(0);
    }
    const size_t b = it->second;
    slots_[variable] = Slot{b, buckets_[b].variables.size()};
    buckets_[b].variables.push_back(variable);
    bucket_bytes[b] += Bytes(param);
    const int64_t limit =
        b == 0 ? options_.first_bucket_bytes : options_.bucket_cap_bytes;
    if (bucket_bytes[b] >= limit) open.erase(it);
  }
  torch::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    int64_t elements = 0;
    for (size_t v : bucket.variables) elements += params_[v].numel();
    const torch::Tensor& first = params_[bucket.variables.front()];
    bucket.contents = torch::zeros({elements}, first.options());
    int64_t offset = 0;
    for (size_t v : bucket.variables) {
      const torch::Tensor& param = params_[v];
      // A plain tensor over the bucket's memory rather than an autograd view
      // of it: LibTorch's Optimizer::zero_grad() detaches gradients in place,
      // which views refuse. The deleter holds the bucket's storage alive.
      void* slice = static_cast<char*>(bucket.contents.data_ptr()) +
                    offset * bucket.contents.element_size();
      bucket.views.push_back(torch::from_blob(
          slice, param.sizes(), [keep = bucket.contents](void*) {},
          bucket.contents.options()));
      offset += param.numel();
    }
    bucket.pending = bucket.variables.size();
  }
  next_bucket_ = 0;
}

absl::Status Reducer::RebuildBuckets() {
  std::vector<size_t> order = ready_order_;
  std::vector<bool> seen(params_.size(), false);
  for (size_t v : order) seen[v] = true;
  for (size_t v = params_.size(); v-- > 0;) {
    if (!seen[v]) order.push_back(v);  // unused: last, in reverse order
  }
  // Every rank adopts rank 0's order, so buckets match across ranks.
  std::vector<int64_t> as_ints(order.begin(), order.end());
  torch::Tensor shared =
      torch::tensor(as_ints, torch::kInt64).to(params_.front().device());
  absl::StatusOr<Buffer> buffer = ToBuffer(shared);
  if (!buffer.ok()) return buffer.status();
  absl::Status status =
      backend_->Await(*backend_->Broadcast(*buffer, 0), options_.timeout);
  if (!status.ok()) return status;
  torch::Tensor agreed = shared.cpu();
  std::vector<size_t> rank0_order(params_.size());
  std::vector<bool> used(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    int64_t v = agreed[i].item<int64_t>();
    if (v < 0 || v >= static_cast<int64_t>(params_.size()) || used[v]) {
      return absl::InternalError(
          "rank 0's gradient order is not a permutation of this rank's "
          "parameters: do all ranks run the same model?");
    }
    used[v] = true;
    rank0_order[i] = static_cast<size_t>(v);
  }
  InitializeBuckets(rank0_order);
  if (options_.gradient_as_bucket_view) PointGradientsAtBuckets();
  rebuilt_ = true;
  ready_order_.clear();
  return absl::OkStatus();
}

void Reducer::PointGradientsAtBuckets() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Slot& slot = slots_[i];
    torch::Tensor& view = buckets_[slot.bucket].views[slot.index];
    const torch::Tensor& grad = params_[i].grad();
    if (grad.defined()) {
      view.copy_(grad);
    } else {
      view.zero_();
    }
    params_[i].mutable_grad() = view;
  }
}

std::vector<std::string> Reducer::UnreadyNamesLocked() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) names.push_back(names_[i]);
  }
  return names;
}

StepTimings Reducer::last_timings() const {
  absl::MutexLock lock(&mu_);
  return last_timings_;
}

std::vector<std::vector<size_t>> Reducer::bucket_assignment() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::vector<size_t>> out;
  for (const Bucket& bucket : buckets_) out.push_back(bucket.variables);
  return out;
}

bool Reducer::buckets_rebuilt() const {
  absl::MutexLock lock(&mu_);
  return rebuilt_;
}

}  // namespace gradsync
