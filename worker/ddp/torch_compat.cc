#include "worker/ddp/torch_compat.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace gradsync {
namespace {

using StateMap = std::decay_t<
    decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = typename StateMap::key_type;

// The key the optimizer's own step looks `param`'s state up by: the
// TensorImpl's address, as text where the map is keyed by strings (what
// 1.13's c10::guts::to_string writes: the pointer through an ostream).
template <typename Key>
Key StateKeyAs(const torch::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << static_cast<const void*>(param.unsafeGetTensorImpl());
    return text.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

StateKey KeyOf(const torch::Tensor& param) { return StateKeyAs<StateKey>(param); }

}  // namespace

GradAccumulatorPtr AddPostAccumulateHook(const torch::Tensor& param,
                                         std::function<void()> hook) {
  GradAccumulatorPtr accumulator = torch::autograd::impl::grad_accumulator(param);
  accumulator->add_post_hook(
      std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [hook = std::move(hook)](
              const torch::autograd::variable_list& outputs,
              const torch::autograd::variable_list& /*inputs*/) {
            hook();
            return outputs;
          }));
  return accumulator;
}

void QueueEndOfBackwardCallback(std::function<void()> callback) {
  torch::autograd::Engine::get_default_engine().queue_callback(
      std::move(callback));
}

const torch::optim::OptimizerParamState* FindOptimizerState(
    const torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  auto it = optimizer.state().find(KeyOf(param));
  return it == optimizer.state().end() ? nullptr : it->second.get();
}

void ReplaceOptimizerState(
    torch::optim::Optimizer& optimizer,
    std::vector<std::pair<torch::Tensor,
                          std::unique_ptr<torch::optim::OptimizerParamState>>>
        states) {
  optimizer.state().clear();
  for (auto& [param, state] : states) {
    optimizer.state()[KeyOf(param)] = std::move(state);
  }
}

}  // namespace gradsync
