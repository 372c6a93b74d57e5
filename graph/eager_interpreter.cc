// The eager interpreter: runs each functional op at once. Global inputs are
// boxed to the inferred signature and the kernel runs on this rank's shards.
// Autograd is a layer over it (graph/autograd.cc).
#include "graph/eager_interpreter.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/boxing_executor.h"
#include "graph/kernel_call.h"
#include "graph/op_profile.h"
#include "graph/sbp_inference.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

namespace tessel {
namespace {

std::string Describe(const OpDef& op, const std::vector<Tensor>& inputs) {
  std::ostringstream os;
  for (size_t i = 0; i < inputs.size(); ++i) {
    os << (i ? ", " : "") << op.input_name(i) << " ";
    if (!inputs[i].defined()) {
      os << "(undefined)";
      continue;
    }
    os << inputs[i].dtype() << " " << inputs[i].shape();
    if (inputs[i].is_global()) os << " " << inputs[i].nd_sbp() << " on " << inputs[i].placement();
  }
  return os.str();
}

std::vector<Tensor> RunGlobal(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                              const std::vector<TensorSpec>& logical,
                              const std::vector<TensorSpec>& out_specs) {
  const Placement& placement = inputs[0].placement();
  for (size_t i = 1; i < inputs.size(); ++i) {
    TESSEL_CHECK(inputs[i].placement() == placement)
        << "op '" << op.name << "': inputs are on different placements (" << Describe(op, inputs)
        << "); move them to one placement with to_global first";
  }
  const std::shared_ptr<const NdSignature> sig_ref = InferNdSignature(op, attrs, inputs, placement);
  const NdSignature& sig = *sig_ref;
  const int rank = CurrentRank();
  std::vector<Tensor> locals;
  std::vector<Box> in_boxes, out_boxes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (VLOG_IS_ON(1) && inputs[i].nd_sbp() != sig.inputs[i]) {
      VLOG(1) << "op '" << op.name << "' boxes " << op.input_name(i) << " " << inputs[i].shape() << " "
              << inputs[i].nd_sbp() << " -> " << sig.inputs[i] << " on " << placement;
    }
    locals.push_back(BoxTo(inputs[i], placement, sig.inputs[i]).to_local());
    in_boxes.push_back(LocalBox(inputs[i].shape(), placement, sig.inputs[i], rank));
  }
  for (int o = 0; o < op.num_outputs; ++o)
    out_boxes.push_back(LocalBox(out_specs[o].shape, placement, sig.outputs[o], rank));
  std::vector<Tensor> outs;
  if (!op.mutates.empty()) CheckNoOverlap(op, locals);
  if (placement.Contains(rank)) {
    const Device device = locals.empty() ? Device::CPU() : locals[0].device();
    outs =
        RunKernel(op, placement.device_type(), KernelFor(op, placement.device_type()),
                  KernelContext{locals, attrs, device, nullptr, logical, out_specs, &in_boxes, &out_boxes});
  } else {
    for (int o = 0; o < op.num_outputs; ++o) {
      outs.push_back(Tensor::Empty(LocalBox(out_specs[o].shape, placement, sig.outputs[o], rank).shape(),
                                   out_specs[o].dtype));
    }
  }
  if (!op.mutates.empty()) return MutatedInputs(op, inputs, locals);
  for (int o = 0; o < op.num_outputs; ++o)
    outs[o] = MakeGlobal(outs[o], out_specs[o].shape, placement, sig.outputs[o]);
  return outs;
}

class EagerInterpreterImpl final : public Interpreter {
 public:
  std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) override {
    if (!OpProfileEnabled()) return Run(op, inputs, attrs);
    return ProfileOp(op.name, inputs, [&] { return Run(op, inputs, attrs); });
  }

 private:
  std::vector<Tensor> Run(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
    if (op.run) return op.run(inputs, attrs);
    std::vector<TensorSpec> specs;
    int globals = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      TESSEL_CHECK(inputs[i].defined())
          << "op '" << op.name << "': input " << op.input_name(i) << " is undefined";
      TESSEL_CHECK(!inputs[i].is_lazy())
          << "op '" << op.name << "': input " << op.input_name(i) << " is lazy " << inputs[i].ToString()
          << " and the eager interpreter needs data: a value traced into a graph used outside its "
             "build, or one autograd kept as metadata only because the op's OpDef::saved does not "
             "list it for its gradient";
      specs.push_back({inputs[i].shape(), inputs[i].dtype()});
      globals += inputs[i].is_global();
    }
    TESSEL_CHECK(globals == 0 || globals == static_cast<int>(inputs.size()))
        << "op '" << op.name << "' mixes local and global inputs (" << Describe(op, inputs)
        << "); make the local ones global with to_global";
    std::vector<TensorSpec> out_specs;
    try {
      out_specs = op.infer(specs, attrs);
    } catch (const Error& e) {
      TESSEL_THROW(e.code()) << "op '" << op.name << "' on " << Describe(op, inputs) << ": " << e.what();
    }
    std::vector<Tensor> outs;
    if (globals > 0) {
      outs = RunGlobal(op, inputs, attrs, specs, out_specs);
    } else {
      std::vector<Tensor> locals;
      for (const Tensor& t : inputs) locals.push_back(t.detach());
      if (!op.mutates.empty()) CheckNoOverlap(op, locals);
      // Local tensors are whole: the context's boxes default to that.
      const Device device = inputs.empty() ? Device::CPU() : inputs[0].device();
      for (const Tensor& t : inputs) {
        TESSEL_CHECK(t.device() == device)
            << "op '" << op.name << "' has inputs on " << device << " and " << t.device() << " ("
            << Describe(op, inputs) << "); move them to one device with .To() first";
      }
      outs = RunKernel(op, device.type(), KernelFor(op, device.type()),
                       KernelContext{locals, attrs, device, nullptr, specs, out_specs});
      if (!op.mutates.empty()) outs = MutatedInputs(op, inputs, locals);
    }
    return outs;
  }
};

}  // namespace

Interpreter& EagerInterpreter() {
  static auto* eager = new EagerInterpreterImpl();  // never destroyed: ops may run at exit
  return *eager;
}

Interpreter& EagerAutogradInterpreter() {
  static auto* eager_autograd = new AutogradInterpreter(EagerInterpreter());
  return *eager_autograd;
}

void InstallEagerInterpreter() { SetDefaultInterpreter(&EagerAutogradInterpreter()); }

}  // namespace tessel
