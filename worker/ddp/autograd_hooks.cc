#include "worker/ddp/autograd_hooks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace gradsync {

std::shared_ptr<torch::autograd::Node> AddPostAccumulateHook(
    const torch::Tensor& param, std::function<void()> hook) {
  std::shared_ptr<torch::autograd::Node> accumulator =
      torch::autograd::impl::grad_accumulator(param);
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

}  // namespace gradsync
