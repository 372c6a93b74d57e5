#include "graph/sbp_inference.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "core/bounded_cache.h"
#include "core/error.h"
#include "graph/boxing_executor.h"
#include "sbp/layout_key.h"
#include "sbp/slice.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

std::string NdSignature::ToString() const {
  std::ostringstream os;
  for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << inputs[i];
  os << " -> ";
  for (size_t i = 0; i < outputs.size(); ++i) os << (i ? ", " : "") << outputs[i];
  return os.str();
}

namespace {

// Rate at which a kernel is assumed to produce output: moving a byte between
// ranks (the planner's 1 GB/s) costs ten times writing it.
constexpr double kComputeBytesPerSecond = 10e9;

// One inference over tensors or specs without copying either: these read
// the same four properties from both.
const Shape& ShapeOf(const Tensor& t) { return t.shape(); }
const Shape& ShapeOf(const GlobalTensorSpec& s) { return s.shape; }
DType DTypeOf(const Tensor& t) { return t.dtype(); }
DType DTypeOf(const GlobalTensorSpec& s) { return s.dtype; }
const Placement& PlacementOf(const Tensor& t) { return t.placement(); }
const Placement& PlacementOf(const GlobalTensorSpec& s) { return s.placement; }
const NdSbp& NdSbpOf(const Tensor& t) { return t.nd_sbp(); }
const NdSbp& NdSbpOf(const GlobalTensorSpec& s) { return s.nd_sbp; }

// The cache key in binary (sbp/layout_key.h): the op, its layout
// attributes, the placement, and per input its placement, NdSbp, shape and
// dtype; placements are their interned ids, so a key costs O(inputs).
template <typename Input>
std::string Key(const OpDef& op, const Attrs& attrs, const std::vector<Input>& inputs, const Placement& p) {
  std::string key;
  key.reserve(128);
  AppendKeyBytes(&key, &op);
  if (!op.layout_attrs) {
    key += attrs.ToString();
  } else if (!op.layout_attrs->empty()) {
    key += attrs.Only(*op.layout_attrs).ToString();
  }
  key += '|';
  AppendKey(&key, p);
  for (const Input& t : inputs) {
    AppendKey(&key, PlacementOf(t));
    AppendKey(&key, NdSbpOf(t));
    AppendKey(&key, ShapeOf(t));
    AppendKey(&key, DTypeOf(t));
  }
  return key;
}

BoundedCache<std::string, std::shared_ptr<const NdSignature>>& SignatureCache() {
  static auto* cache =
      new BoundedCache<std::string, std::shared_ptr<const NdSignature>>(kSignatureCacheCapacity);
  return *cache;
}

// The next combination (odometer order), holding replicated axes at the
// all-B signature; false after the last combination.
bool Advance(std::vector<size_t>* pick, const std::vector<bool>& fixed, size_t count) {
  for (int a = static_cast<int>(pick->size()) - 1; a >= 0; --a) {
    if (fixed[a]) continue;
    if (++(*pick)[a] < count) return true;
    (*pick)[a] = 0;
  }
  return false;
}

template <typename Input>
std::shared_ptr<const NdSignature> Infer(const OpDef& op, const Attrs& attrs,
                                         const std::vector<Input>& inputs, const Placement& placement) {
  const std::string key = Key(op, attrs, inputs, placement);
  if (auto hit = SignatureCache().Get(key)) return *hit;
  std::vector<TensorSpec> specs;
  for (const Input& t : inputs) specs.push_back({ShapeOf(t), DTypeOf(t)});
  std::vector<SbpSignature> one = op.sbp ? op.sbp(specs, attrs) : std::vector<SbpSignature>{};
  one.push_back({std::vector<Sbp>(inputs.size(), B()), std::vector<Sbp>(op.num_outputs, B())});

  const std::vector<TensorSpec> out_specs = op.infer(specs, attrs);
  const std::vector<int64_t> corner(placement.ndim(), 0);  // the largest shard (larger parts first)
  const int axes = placement.ndim();
  NdSignature best;
  double best_cost = std::numeric_limits<double>::infinity();
  int best_conversions = -1;  // -1: nothing chosen yet
  std::vector<size_t> pick(axes, 0);
  // A mesh axis on which every input is replicated (and already in place)
  // stays replicated: replicated inputs give a replicated output, as users
  // of eager global tensors expect, rather than a "free" split that a later
  // consumer (or a parameter's gradient) must gather again.
  std::vector<bool> replicated_axis(axes, !inputs.empty());
  for (const Input& t : inputs) {
    for (int a = 0; a < axes; ++a)
      if (PlacementOf(t) != placement || !NdSbpOf(t)[a].is_broadcast()) replicated_axis[a] = false;
  }
  for (int a = 0; a < axes; ++a)
    if (replicated_axis[a]) pick[a] = one.size() - 1;  // the all-B signature
  // Every combination of one 1-D signature per mesh axis.
  while (true) {
    NdSignature cand;
    cand.inputs.assign(inputs.size(), NdSbp(std::vector<Sbp>(axes, B())));
    cand.outputs.assign(op.num_outputs, NdSbp(std::vector<Sbp>(axes, B())));
    for (int a = 0; a < axes; ++a) {
      const SbpSignature& s = one[pick[a]];
      for (size_t i = 0; i < inputs.size(); ++i) cand.inputs[i][a] = s.inputs[i];
      for (int o = 0; o < op.num_outputs; ++o) cand.outputs[o][a] = s.outputs[o];
    }
    bool converts_mutated = false;
    for (int i : op.mutates) {
      converts_mutated |= PlacementOf(inputs[i]) != placement || NdSbpOf(inputs[i]) != cand.inputs[i];
    }
    if (converts_mutated ||
        (op.check_layout && !op.check_layout(attrs, specs, cand.inputs, cand.outputs, placement))) {
      if (!Advance(&pick, replicated_axis, one.size())) break;
      continue;
    }
    // Cost = boxing the inputs + writing the outputs' shards (so split
    // compute beats replicated compute); ties go to fewer converted inputs,
    // then to the op's own order: a signature matching the producers wins.
    double boxing = 0;
    int conversions = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (PlacementOf(inputs[i]) == placement && NdSbpOf(inputs[i]) == cand.inputs[i]) continue;
      ++conversions;
      boxing += GetBoxingPlan(PlacementOf(inputs[i]), NdSbpOf(inputs[i]), placement, cand.inputs[i],
                              ShapeOf(inputs[i]), DTypeOf(inputs[i]))
                    ->seconds();
    }
    double compute = 0;
    for (int o = 0; o < op.num_outputs; ++o) {
      compute += static_cast<double>(
                     SliceOf(out_specs[o].shape, cand.outputs[o], placement.hierarchy(), corner).numel() *
                     static_cast<int64_t>(ElementSize(out_specs[o].dtype))) /
                 kComputeBytesPerSecond;
    }
    const double cost = boxing + compute;
    // A candidate that converts nothing beats any that converts something
    // (match the producers: a "free" slice now is a gather later); among
    // equals, the cheaper, then the one converting fewer inputs.
    const bool matches = conversions == 0, best_matches = best_conversions == 0 && best_cost < 1e300;
    bool take;
    if (matches != best_matches) {
      take = matches;
    } else if (std::abs(cost - best_cost) > 1e-15) {
      take = cost < best_cost;
    } else {
      take = conversions < best_conversions;
    }
    if (take) {
      best_cost = cost;
      best_conversions = conversions;
      best = cand;
      best.boxing_seconds = boxing;
    }
    if (!Advance(&pick, replicated_axis, one.size())) break;
  }
  if (best_conversions < 0) {
    std::ostringstream os;
    for (size_t i = 0; i < inputs.size(); ++i) {
      os << (i ? ", " : "") << op.input_name(i) << " " << ShapeOf(inputs[i]) << " " << NdSbpOf(inputs[i]);
    }
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "op '" << op.name << "' has no SBP signature on " << placement << " for " << os.str()
        << (op.mutates.empty() ? "" : " (inputs it updates in place keep their layouts)");
  }
  auto sig = std::make_shared<const NdSignature>(std::move(best));
  SignatureCache().Put(key, sig);
  return sig;
}

}  // namespace

size_t SignatureCacheSize() { return SignatureCache().size(); }

std::shared_ptr<const NdSignature> InferNdSignature(const OpDef& op, const Attrs& attrs,
                                                    const std::vector<GlobalTensorSpec>& inputs,
                                                    const Placement& placement) {
  return Infer(op, attrs, inputs, placement);
}

std::shared_ptr<const NdSignature> InferNdSignature(const OpDef& op, const Attrs& attrs,
                                                    const std::vector<Tensor>& inputs,
                                                    const Placement& placement) {
  return Infer(op, attrs, inputs, placement);
}

}  // namespace tessel
