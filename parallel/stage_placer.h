// The interpreter layer that runs a model written for one device over a
// plan's stages. While the model's forward runs under it, each op runs on
// the latest stage among its inputs' placements (activations only flow to
// later stages): an input on an earlier stage is moved there with its
// layout (to_global, differentiable: its gradient travels back), and a
// local tensor the model built itself (a range of positions, say) joins as
// replicated. Ops whose inputs are all local stay local. A value is moved
// to a stage once, however many ops there read it. A partial sum an op
// gives (a row-parallel layer's product, a vocabulary-parallel lookup) is
// reduced right away, as Megatron's layers do. Backward ops pass through:
// their layouts follow from the forward's.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "ops/interpreter.h"
#include "sbp/placement.h"

namespace tessel::parallel {

class StagePlacer final : public Interpreter {
 public:
  // `stages`: each stage's placement in pipeline order, all of one mesh
  // shape. `inner`: the interpreter underneath (autograd, when backward is
  // to follow).
  StagePlacer(Interpreter& inner, std::vector<Placement> stages);

  std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) override;
  bool records() const override { return inner_.records(); }

 private:
  // The stage of a placement; throws naming the op if it is none of them.
  int StageOf(const Placement& p, const OpDef& op) const;
  Tensor MovedTo(const Tensor& t, int stage);

  Interpreter& inner_;
  std::vector<Placement> stages_;
  bool moving_ = false;
  // (tensor, stage) -> moved; holds the source so its address stays unique.
  std::map<std::pair<const void*, int>, std::pair<Tensor, Tensor>> moved_;
};

}  // namespace tessel::parallel
