// softmax over the last dimension, and softmax_grad.
#include "ops/cpu/softmax.h"

#include "ops/defs/def_util.h"
#include "ops/functional.h"

namespace tessel {

void RegisterSoftmaxOps() {
  OpDef def;
  def.name = "softmax";
  def.inputs = {"x"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("softmax", in[0], "x");
    TESSEL_CHECK(in[0].shape.ndim() >= 1) << "softmax needs a tensor of rank >= 1";
    return std::vector<TensorSpec>{in[0]};
  };
  // Rows are independent: any split but of the softmax dimension.
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::AllSplitAlike(in[0].shape.ndim(), 1, 1, in[0].shape.ndim() - 1);
  };
  def.kernels[DeviceType::kCPU] = [](const std::vector<Tensor>& in, const Attrs&) {
    return std::vector<Tensor>{cpu::Softmax(in[0])};
  };
  def.grad = [](const GradContext& c) { return ApplyOp("softmax_grad", {c.outputs[0], c.grad_outputs[0]}); };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "softmax_grad";
  grad.inputs = {"y", "dy"};
  grad.infer = defs::SameAsInput;
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::AllSplitAlike(in[0].shape.ndim(), 2, 1, in[0].shape.ndim() - 1);
  };
  grad.kernels[DeviceType::kCPU] = [](const std::vector<Tensor>& in, const Attrs&) {
    return std::vector<Tensor>{cpu::SoftmaxGrad(in[0], in[1])};
  };
  RegisterOp(std::move(grad));
}

}  // namespace tessel
