#include "worker/ddp/sync_batch_norm.h"

#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/ddp/tensor_buffer.h"

namespace gradsync {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the autograd node of one training forward needs of its module: the
// backend, and where to report a failed collective.
struct Communicator : torch::CustomClassHolder {
  Communicator(Backend* backend, absl::Duration timeout,
               std::function<void(absl::Status)> report)
      : backend(backend), timeout(timeout), report(std::move(report)) {}
  Backend* backend;
  absl::Duration timeout;
  std::function<void(absl::Status)> report;
};

// Throws (for autograd and the training loop) after reporting `status`.
void FailWith(const Communicator& comm, const absl::Status& status,
              const char* what) {
  comm.report(status);
  TORCH_CHECK(false, "SyncBatchNorm: ", what, " failed: ", status.ToString());
}

// [1, C, 1, ...] for broadcasting per-channel values over `input`.
std::vector<int64_t> ChannelShape(const torch::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return shape;
}

// Every dimension but the channels'.
std::vector<int64_t> ReducedDims(const torch::Tensor& input) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// What the statistics and gradient sums are accumulated in: double on the
// CPU (as ATen's batch norm accumulates there: in float32 the sums lose
// enough to be seen after a few steps of training), float on CUDA, double
// for double input.
torch::ScalarType AccumulateType(const torch::Tensor& input) {
  return input.is_cuda() && input.scalar_type() != torch::kDouble
             ? torch::kFloat
             : torch::kDouble;
}

class SyncBatchNormFunction
    : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor input,
                               torch::Tensor weight, torch::Tensor bias,
                               torch::Tensor running_mean,
                               torch::Tensor running_var, double eps,
                               double momentum,
                               c10::intrusive_ptr<Communicator> comm) {
    const int64_t channels = input.size(1);
    const torch::ScalarType type = AccumulateType(input);
    const std::vector<int64_t> dims = ReducedDims(input);
    const std::vector<int64_t> shape = ChannelShape(input);
    torch::Tensor x = input.to(type);
    const int64_t count = channels > 0 ? input.numel() / channels : 0;

    // This rank's count, mean and squared deviations, in float64 so counts
    // and the combination are exact.
    auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(input.device());
    torch::Tensor stats = torch::zeros({2 * channels + 1}, f64);
    if (count > 0) {
      torch::Tensor mean = x.mean(dims);
      torch::Tensor m2 = (x - mean.view(shape)).pow(2).sum(dims);
      stats.narrow(0, 0, channels).copy_(mean);
      stats.narrow(0, channels, channels).copy_(m2);
    }
    stats[2 * channels] = static_cast<double>(count);
    const int world = comm->backend->world_size();
    torch::Tensor gathered = torch::empty({world * (2 * channels + 1)}, f64);
    absl::StatusOr<Buffer> in = ToBuffer(stats);
    absl::StatusOr<Buffer> out = ToBuffer(gathered);
    absl::Status status = in.ok() ? out.status() : in.status();
    if (status.ok()) {
      status = comm->backend->Await(*comm->backend->AllGather(*in, *out),
                                    comm->timeout);
    }
    if (!status.ok()) FailWith(*comm, status, "gathering batch statistics");
    gathered = gathered.view({world, 2 * channels + 1});

    // Chan et al.'s combination of per-rank moments.
    torch::Tensor counts = gathered.narrow(1, 2 * channels, 1);  // [W, 1]
    torch::Tensor means = gathered.narrow(1, 0, channels);
    torch::Tensor m2s = gathered.narrow(1, channels, channels);
    const double total = counts.sum().item<double>();
    TORCH_CHECK(total > 1,
                "SyncBatchNorm: expected more than 1 value per channel across "
                "all ranks when training, got ", total);
    torch::Tensor mean = (means * counts).sum(0) / total;
    torch::Tensor m2 = m2s.sum(0) + (counts * (means - mean).pow(2)).sum(0);
    torch::Tensor invstd = (m2 / total + eps).rsqrt();

    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype()),
                                           momentum);
      running_var.mul_(1 - momentum).add_(
          (m2 / (total - 1)).to(running_var.dtype()), momentum);
    }
    torch::Tensor mean_c = mean.to(type), invstd_c = invstd.to(type);
    torch::Tensor y = (x - mean_c.view(shape)) * invstd_c.view(shape);
    if (weight.defined()) y = y * weight.to(type).view(shape);
    if (bias.defined()) y = y + bias.to(type).view(shape);

    ctx->save_for_backward({input, weight, mean_c, invstd_c});
    ctx->saved_data["total"] = total;
    ctx->saved_data["comm"] = c10::IValue::make_capsule(std::move(comm));
    return y.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx,
                                variable_list grad_outputs) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& mean = saved[2];
    const torch::Tensor& invstd = saved[3];
    const double total = ctx->saved_data["total"].toDouble();
    auto comm = c10::static_intrusive_pointer_cast<Communicator>(
        ctx->saved_data["comm"].toCapsule());

    const torch::ScalarType type = AccumulateType(input);
    const std::vector<int64_t> dims = ReducedDims(input);
    const std::vector<int64_t> shape = ChannelShape(input);
    const int64_t channels = input.size(1);
    torch::Tensor dy = grad_outputs[0].to(type);
    torch::Tensor xmu = input.to(type) - mean.view(shape);
    torch::Tensor sum_dy = dy.sum(dims);
    torch::Tensor sum_dy_xmu = (dy * xmu).sum(dims);

    torch::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      // The global sums over every rank's samples.
      torch::Tensor sums = torch::cat({sum_dy, sum_dy_xmu});
      absl::StatusOr<Buffer> buffer = ToBuffer(sums);
      absl::Status status = buffer.status();
      if (status.ok()) {
        status = comm->backend->Await(
            *comm->backend->AllReduce(*buffer, ReduceOp::kSum), comm->timeout);
      }
      if (!status.ok()) FailWith(*comm, status, "reducing gradients");
      torch::Tensor mean_dy = sums.narrow(0, 0, channels) / total;
      torch::Tensor mean_dy_xmu = sums.narrow(0, channels, channels) / total;
      torch::Tensor scale = invstd;
      if (weight.defined()) scale = scale * weight.to(type);
      grad_input = (dy - mean_dy.view(shape) -
                    xmu * (invstd * invstd * mean_dy_xmu).view(shape)) *
                   scale.view(shape);
      grad_input = grad_input.to(input.scalar_type());
    }
    if (weight.defined() && ctx->needs_input_grad(1)) {
      grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(2)) {
      grad_bias = sum_dy.to(weight.defined() ? weight.scalar_type()
                                             : input.scalar_type());
    }
    return {grad_input,      grad_weight,     grad_bias,       torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

bool IsBatchNorm(const torch::nn::Module& module) {
  return module.as<torch::nn::BatchNorm1dImpl>() != nullptr ||
         module.as<torch::nn::BatchNorm2dImpl>() != nullptr ||
         module.as<torch::nn::BatchNorm3dImpl>() != nullptr;
}

// Where a BatchNorm sits in the tree.
struct Site {
  torch::nn::Module* parent = nullptr;
  std::string name;  // in the parent
  std::string path;  // from the root, for messages
  std::shared_ptr<torch::nn::Module> module;
};

void FindBatchNorms(torch::nn::Module& parent, const std::string& prefix,
                    std::vector<Site>* sites) {
  for (const auto& child : parent.named_children()) {
    const std::string path = prefix + child.key();
    if (IsBatchNorm(*child.value())) {
      sites->push_back({&parent, child.key(), path, child.value()});
    } else {
      FindBatchNorms(*child.value(), path + ".", sites);
    }
  }
}

std::string TypeName(const torch::nn::Module& module) {
  if (module.as<torch::nn::BatchNorm1dImpl>() != nullptr) return "BatchNorm1d";
  if (module.as<torch::nn::BatchNorm2dImpl>() != nullptr) return "BatchNorm2d";
  return "BatchNorm3d";
}

template <typename Impl>
std::shared_ptr<SyncBatchNormImpl> FromBatchNorm(const Impl& bn) {
  auto sync = std::make_shared<SyncBatchNormImpl>(
      bn.options, bn.weight, bn.bias, bn.running_mean, bn.running_var,
      bn.num_batches_tracked);
  sync->train(bn.is_training());
  return sync;
}

std::shared_ptr<SyncBatchNormImpl> FromAnyBatchNorm(
    const torch::nn::Module& module) {
  if (auto* bn = module.as<torch::nn::BatchNorm1dImpl>()) return FromBatchNorm(*bn);
  if (auto* bn = module.as<torch::nn::BatchNorm2dImpl>()) return FromBatchNorm(*bn);
  return FromBatchNorm(*module.as<torch::nn::BatchNorm3dImpl>());
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options)
    : options(options) {
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                                     torch::Tensor weight, torch::Tensor bias,
                                     torch::Tensor running_mean,
                                     torch::Tensor running_var,
                                     torch::Tensor num_batches_tracked)
    : options(options) {
  Register(std::move(weight), std::move(bias), std::move(running_mean),
           std::move(running_var), std::move(num_batches_tracked),
           /*shared=*/true);
}

void SyncBatchNormImpl::reset() {
  link_ = std::make_shared<Link>();
  const int64_t n = options.num_features();
  const bool affine = options.affine();
  const bool track = options.track_running_stats();
  Register(affine ? torch::ones({n}) : torch::Tensor(),
           affine ? torch::zeros({n}) : torch::Tensor(),
           track ? torch::zeros({n}) : torch::Tensor(),
           track ? torch::ones({n}) : torch::Tensor(),
           track ? torch::tensor(0, torch::dtype(torch::kLong)) : torch::Tensor(),
           /*shared=*/false);
}

void SyncBatchNormImpl::Register(torch::Tensor weight, torch::Tensor bias,
                                 torch::Tensor running_mean,
                                 torch::Tensor running_var,
                                 torch::Tensor num_batches_tracked,
                                 bool shared) {
  // New parameters train; a BatchNorm's keep their setting (frozen or not).
  const bool weight_grad =
      weight.defined() && (!shared || weight.requires_grad());
  const bool bias_grad = bias.defined() && (!shared || bias.requires_grad());
  this->weight = register_parameter("weight", std::move(weight), weight_grad);
  this->bias = register_parameter("bias", std::move(bias), bias_grad);
  this->running_mean = register_buffer("running_mean", std::move(running_mean));
  this->running_var = register_buffer("running_var", std::move(running_var));
  this->num_batches_tracked =
      register_buffer("num_batches_tracked", std::move(num_batches_tracked));
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  torch::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "gradsync::SyncBatchNorm(" << options.num_features()
         << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

void SyncBatchNormImpl::Attach(Backend* backend, absl::Duration timeout) {
  absl::MutexLock lock(&link_->mu);
  link_->backend = backend;
  link_->timeout = timeout;
}

absl::Status SyncBatchNormImpl::communication_error() const {
  absl::MutexLock lock(&link_->mu);
  return link_->error;
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2,
              "SyncBatchNorm: expected at least 2D input (got ", input.dim(),
              "D input)");
  TORCH_CHECK(input.size(1) == options.num_features(),
              "SyncBatchNorm: expected ", options.num_features(),
              " channels in dimension 1, got ", input.size(1));
  // BatchNorm's momentum, or a cumulative average without one.
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
    if (!options.momentum().has_value()) {
      factor = 1.0 / num_batches_tracked.item<double>();
    }
  }
  const bool use_batch_stats = is_training() || !options.track_running_stats();
  Backend* backend = nullptr;
  absl::Duration timeout;
  {
    absl::MutexLock lock(&link_->mu);
    backend = link_->backend;
    timeout = link_->timeout;
    link_->error = absl::OkStatus();
  }
  if (!use_batch_stats || backend == nullptr || backend->world_size() == 1) {
    return torch::nn::functional::detail::batch_norm(
        input, running_mean, running_var, weight, bias, use_batch_stats,
        factor, options.eps());
  }
  std::shared_ptr<Link> link = link_;
  auto report = [link](absl::Status status) {
    absl::MutexLock lock(&link->mu);
    link->error = std::move(status);
  };
  return SyncBatchNormFunction::apply(
      input, weight, bias, running_mean, running_var, options.eps(), factor,
      c10::make_intrusive<Communicator>(backend, timeout, std::move(report)));
}

absl::StatusOr<std::shared_ptr<torch::nn::Module>> ConvertSyncBatchNorm(
    std::shared_ptr<torch::nn::Module> module) {
  if (module == nullptr) {
    return absl::InvalidArgumentError("ConvertSyncBatchNorm: no module given");
  }
  if (IsBatchNorm(*module)) return FromAnyBatchNorm(*module);
  std::vector<Site> sites;
  FindBatchNorms(*module, "", &sites);
  // Check every site before changing any: all or nothing.
  for (const Site& site : sites) {
    auto* sequential = site.parent->as<torch::nn::SequentialImpl>();
    // Ours, the parent's registry, and a Sequential's module list.
    const long expected = 2 + (sequential != nullptr ? 1 : 0);
    if (site.module.use_count() > expected) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ConvertSyncBatchNorm: cannot swap '", site.path, "' (",
          TypeName(*site.module),
          ") for a SyncBatchNorm: something besides its parent's module list "
          "holds it, typically a torch::nn::", TypeName(*site.module),
          " field that the parent's forward() calls, which would go on "
          "running plain batch norm. Hold it only in a torch::nn::Sequential, "
          "or register it and call it with gradsync::ForwardBatchNorm(*this, "
          "\"", site.name, "\", x), or build the model with "
          "gradsync::SyncBatchNorm; nothing was converted"));
    }
  }
  for (Site& site : sites) {
    std::shared_ptr<SyncBatchNormImpl> sync = FromAnyBatchNorm(*site.module);
    if (auto* sequential = site.parent->as<torch::nn::SequentialImpl>()) {
      size_t index = 0;
      for (const auto& child : sequential->named_children()) {
        if (child.key() == site.name) break;
        ++index;
      }
      *(sequential->begin() + index) = torch::nn::AnyModule(SyncBatchNorm(sync));
    }
    site.parent->replace_module(site.name, sync);
  }
  return module;
}

torch::Tensor ForwardBatchNorm(torch::nn::Module& module,
                               const std::string& name,
                               const torch::Tensor& input) {
  auto children = module.named_children();
  std::shared_ptr<torch::nn::Module>* child = children.find(name);
  TORCH_CHECK(child != nullptr, "ForwardBatchNorm: no child module '", name,
              "'");
  torch::nn::Module& norm = **child;
  if (auto* m = norm.as<SyncBatchNormImpl>()) return m->forward(input);
  if (auto* m = norm.as<torch::nn::BatchNorm2dImpl>()) return m->forward(input);
  if (auto* m = norm.as<torch::nn::BatchNorm1dImpl>()) return m->forward(input);
  if (auto* m = norm.as<torch::nn::BatchNorm3dImpl>()) return m->forward(input);
  TORCH_CHECK(false, "ForwardBatchNorm: child module '", name,
              "' is not a batch norm layer");
  return torch::Tensor();
}

std::vector<std::shared_ptr<SyncBatchNormImpl>> FindSyncBatchNorms(
    torch::nn::Module& module) {
  std::vector<std::shared_ptr<SyncBatchNormImpl>> found;
  for (const std::shared_ptr<torch::nn::Module>& m : module.modules()) {
    if (auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(m)) {
      found.push_back(sync);
    }
  }
  return found;
}

}  // namespace gradsync
