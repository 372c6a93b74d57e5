// The op registry. An op is one OpDef: its attributes, shape/dtype
// inference, 1-D SBP signature candidates, kernels per device type and its
// gradient (written with functional ops, so one definition serves local and
// global tensors, eager and lazy). Adding an op is one file in ops/defs/
// with a Register*Ops() function, listed in ops/defs/all_ops.cc (see
// docs/adding_an_op.md). The list is explicit because a static library
// drops object files that only hold self-registering statics.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/tensor.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"
#include "sbp/slice.h"

namespace tessel {

using AttrValue = std::variant<bool, int64_t, double, std::vector<int64_t>, std::string>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> init) : values_(init) {}
  Attrs& Set(const std::string& name, AttrValue value) {
    values_[name] = std::move(value);
    return *this;
  }
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // Throws naming the attribute if it is missing or of another type.
  template <typename T>
  const T& Get(const std::string& name) const;
  std::string ToString() const;
  const std::map<std::string, AttrValue>& values() const { return values_; }
  // Only the named attributes (those present), e.g. for cache keys.
  Attrs Only(const std::vector<std::string>& names) const;

 private:
  std::map<std::string, AttrValue> values_;
};

struct TensorSpec {
  Shape shape;
  DType dtype = DType::kFloat32;
};

// A global value as compiler passes see it: logical shape, dtype and layout,
// no data. SBP signature inference takes these, so a pass infers layouts on
// a graph of specs exactly as eager dispatch does on tensors.
struct GlobalTensorSpec {
  Shape shape;
  DType dtype = DType::kFloat32;
  Placement placement;
  NdSbp nd_sbp;
  // The spec of a global tensor (throws naming the call if it is local).
  static GlobalTensorSpec Of(const Tensor& t);
};

// One 1-D SBP signature: an Sbp per input and per output.
struct SbpSignature {
  std::vector<Sbp> inputs;
  std::vector<Sbp> outputs;
  std::string ToString() const;
};

// What a gradient function sees. grad_outputs[i] is undefined when output
// i got no gradient; a gradient function returns one tensor per input
// (undefined where needs_input_grad is false or the input is not
// differentiable).
struct GradContext {
  const std::vector<Tensor>& inputs;
  const std::vector<Tensor>& outputs;
  const std::vector<Tensor>& grad_outputs;
  const Attrs& attrs;
  const std::vector<bool>& needs_input_grad;
};

// What a kernel runs with: this rank's data and where it sits in the
// logical tensors. Attributes are always the logical ones the op was called
// with; a kernel whose work depends on position or size reads the boxes
// (a local op's boxes are whole, begin 0), so one code path serves local
// tensors and shards of global ones.
struct KernelContext {
  const std::vector<Tensor>& inputs;  // local data: a global input's shard
  const Attrs& attrs;
  Device device;           // where the inputs live and the outputs go
  void* stream = nullptr;  // the device stream to run on (CUDA); null: host / default stream
  const std::vector<TensorSpec>& logical_inputs;
  const std::vector<TensorSpec>& logical_outputs;
  // The logical box of each local input and output; null for a local run,
  // whose boxes are whole (not built on the local dispatch path).
  const std::vector<Box>* input_boxes = nullptr;
  const std::vector<Box>* output_boxes = nullptr;

  Box input_box(int i) const { return input_boxes ? (*input_boxes)[i] : Box::Full(logical_inputs[i].shape); }
  Box output_box(int o) const {
    return output_boxes ? (*output_boxes)[o] : Box::Full(logical_outputs[o].shape);
  }
  // This rank's shape of output `o` (its box's shape).
  Shape output_shape(int o) const {
    return output_boxes ? (*output_boxes)[o].shape() : logical_outputs[o].shape;
  }
};

using Kernel = std::function<std::vector<Tensor>(const KernelContext& ctx)>;

struct OpDef {
  std::string name;
  std::vector<std::string> inputs;  // names, for messages
  bool variadic = false;            // any number (>= 1) of inputs named inputs[0]
  // The name of input i for messages (a variadic op's inputs share the last).
  const std::string& input_name(size_t i) const { return inputs[std::min(i, inputs.size() - 1)]; }
  int num_outputs = 1;
  // Output specs from input specs; throws naming the op and shapes.
  std::function<std::vector<TensorSpec>(const std::vector<TensorSpec>&, const Attrs&)> infer;
  // 1-D signatures valid for these input specs. The all-B signature
  // (replicated compute) is always added by the dispatcher.
  std::function<std::vector<SbpSignature>(const std::vector<TensorSpec>&, const Attrs&)> sbp;
  // Optional: whether an N-D signature is valid on this placement for these
  // logical inputs (for ops whose rules depend on how sizes divide); the
  // dispatcher skips candidates it rejects.
  std::function<bool(const Attrs&, const std::vector<TensorSpec>& inputs, const std::vector<NdSbp>& in_sbp,
                     const std::vector<NdSbp>& out_sbp, const Placement& placement)>
      check_layout;
  // The attributes that shape inference, the SBP signatures and
  // check_layout read; only these key the dispatch caches. Unset: all of
  // them. Ops whose attributes change every call (a learning rate, a step,
  // a random offset, a scale) list only the others, so a training step
  // reuses its signatures instead of adding and searching new ones.
  std::optional<std::vector<std::string>> layout_attrs;
  std::map<DeviceType, Kernel> kernels;
  // Set for ops the eager interpreter runs as a whole instead of through
  // SBP inference and a kernel: the layout changes (graph/: to_global,
  // from_local), which communicate. Their inputs may be local or global,
  // and their gradients choose their own layouts.
  std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, const Attrs& attrs)> run;
  // Inputs the kernel updates in place (parameters and optimizer state:
  // variables that keep their identity across steps, as a graph needs).
  // The op's outputs are exactly these inputs, in this order, as the same
  // handles (same storage); num_outputs must equal their count. They are
  // never boxed (a converted copy would take the write and lose it), so
  // signature inference keeps their layouts; and autograd refuses to update
  // a tensor that requires gradients while recording.
  std::vector<int> mutates;
  // The result is a view of input 0 (same storage; reshape): memory
  // planning (graph/passes/memory_planning.h) counts no new bytes for it
  // and keeps input 0's buffer alive as long as the view.
  bool view = false;
  // The op exchanges data with other ranks (layout changes, fused
  // reductions, pipeline sends and receives): the actor runtime runs it on
  // its communication thread, in the same order on every rank of a group.
  bool communicates = false;
  // Bytes the kernel (or `run`) allocates for itself and frees before it
  // returns, from this rank's shard specs of the inputs: memory planning
  // counts them while the op runs. Unset: none.
  std::function<int64_t(const std::vector<TensorSpec>& shards)> workspace_bytes;
  // The gradient: one tensor per input, for every input that needs one
  // (GradContext::needs_input_grad). Unset only together with
  // not_differentiable, or for ops whose outputs are never floating.
  std::function<std::vector<Tensor>(const GradContext&)> grad;
  // The outputs are constants to autograd by design (comparisons, integer
  // results, random draws, counters, optimizer updates): nothing flows back
  // through the op. An op with neither `grad` nor this mark whose floating
  // output is used in a loss that reaches a tensor requiring gradients makes
  // backward() fail naming the op, instead of dropping that path silently.
  bool not_differentiable = false;
  // Why an op that could carry a gradient has none on purpose (a gradient
  // op: no double backward); a gradient reaching it fails with this reason.
  std::string grad_unsupported;
  // Which values the gradient function reads (indices into inputs and
  // outputs). Unset: all of them. Autograd keeps the others as metadata
  // only (shape, dtype, layout; no data: Tensor::metadata_only), so a
  // recorded op does not keep activations alive its gradient never reads.
  struct SavedForGrad {
    std::vector<int> inputs;
    std::vector<int> outputs;
  };
  std::optional<SavedForGrad> saved;
};

// Registers `def`; throws if the name is taken.
void RegisterOp(OpDef def);
// Throws naming the op if it is unknown.
const OpDef& GetOpDef(const std::string& name);
std::vector<std::string> RegisteredOps();

}  // namespace tessel
