#include "parallel/stage_placer.h"

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::parallel {

namespace {
// Sets a flag for a scope (the placer's own moves pass through it).
struct FlagScope {
  explicit FlagScope(bool& f) : flag(f) { flag = true; }
  ~FlagScope() { flag = false; }
  bool& flag;
};
}  // namespace

StagePlacer::StagePlacer(Interpreter& inner, std::vector<Placement> stages)
    : inner_(inner), stages_(std::move(stages)) {
  TESSEL_CHECK(!stages_.empty()) << "StagePlacer needs at least one stage";
  for (const Placement& p : stages_)
    TESSEL_CHECK(p.hierarchy() == stages_[0].hierarchy())
        << "StagePlacer: stage placements " << stages_[0].ToString() << " and " << p.ToString()
        << " have different mesh shapes";
}

int StagePlacer::StageOf(const Placement& p, const OpDef& op) const {
  for (size_t s = 0; s < stages_.size(); ++s)
    if (stages_[s] == p) return static_cast<int>(s);
  std::string known;
  for (const Placement& s : stages_) known += (known.empty() ? "" : ", ") + s.ToString();
  TESSEL_THROW(StatusCode::kInvalidArgument) << "op '" << op.name << "' reads a tensor on " << p.ToString()
                                             << ", which is none of the plan's stages (" << known << ")";
}

Tensor StagePlacer::MovedTo(const Tensor& t, int stage) {
  const auto key = std::make_pair(static_cast<const void*>(t.impl_ptr().get()), stage);
  auto it = moved_.find(key);
  if (it != moved_.end()) return it->second.second;
  const Placement& p = stages_[static_cast<size_t>(stage)];
  Tensor moved;
  {
    FlagScope busy(moving_);
    if (t.is_global()) {
      moved = t.to_global(p, t.nd_sbp());
    } else {
      // A tensor the model made itself: every rank made the same one.
      moved = FromLocal(t, p, NdSbp(std::vector<Sbp>(static_cast<size_t>(p.ndim()), B())), t.shape());
    }
  }
  moved_.emplace(key, std::make_pair(t, moved));
  return moved;
}

std::vector<Tensor> StagePlacer::Apply(const OpDef& op, const std::vector<Tensor>& inputs,
                                       const Attrs& attrs) {
  if (moving_ || InBackward() || op.name == "to_global" || op.name == "from_local")
    return inner_.Apply(op, inputs, attrs);
  int stage = -1;
  bool mixed = false;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (!t.is_global()) {
      mixed = true;
      continue;
    }
    const int s = StageOf(t.placement(), op);
    if (stage >= 0 && s != stage) mixed = true;
    stage = std::max(stage, s);
  }
  std::vector<Tensor> outputs;
  if (stage < 0 || !mixed) {
    outputs = inner_.Apply(op, inputs, attrs);
  } else {
    std::vector<Tensor> placed = inputs;
    for (Tensor& t : placed)
      if (t.defined() && (!t.is_global() || t.placement() != stages_[static_cast<size_t>(stage)]))
        t = MovedTo(t, stage);
    outputs = inner_.Apply(op, placed, attrs);
  }
  // Partial sums reduced at once (Megatron's all-reduce after a row layer
  // or a vocabulary-parallel lookup): left partial, inference would rather
  // reduce-scatter them into a split the next layers cannot keep.
  FlagScope busy(moving_);
  for (Tensor& t : outputs)
    if (t.defined() && t.is_global() && t.nd_sbp().has_partial())
      t = t.to_global(t.placement(), t.nd_sbp().WithoutPartial());
  return outputs;
}

}  // namespace tessel::parallel
