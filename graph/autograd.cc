#include "graph/autograd.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "graph/autograd_internal.h"
#include "graph/boxing_executor.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

namespace tessel {

namespace {
thread_local bool g_grad_mode = true;
thread_local LeafGradientWatch* g_leaf_gradient_watch = nullptr;
thread_local int g_recompute_region = -1;
thread_local int g_recompute_regions_opened = 0;
thread_local bool g_in_backward = false;
thread_local int64_t g_layer = -1;

// Sum of two gradients that may be undefined.
Tensor Accumulate(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return fn::add(a, b);
}

// Each of `values` detached; those not listed in `read` (null: all are
// read) as metadata only.
std::vector<Tensor> KeepForGradient(const std::vector<Tensor>& values, const std::vector<int>* read) {
  std::vector<Tensor> kept;
  kept.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const bool reads =
        read == nullptr || std::find(read->begin(), read->end(), static_cast<int>(i)) != read->end();
    kept.push_back(reads ? values[i].detach() : values[i].metadata_only());
  }
  return kept;
}
// Whether outs[o] shares its implementation with an input or an earlier output.
bool SharesImpl(const Tensor& t, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs,
                size_t o) {
  for (const Tensor& x : inputs)
    if (x.impl_ptr() == t.impl_ptr()) return true;
  for (size_t i = 0; i < o; ++i)
    if (outs[i].impl_ptr() == t.impl_ptr()) return true;
  return false;
}

// Names joined as "a, b and c", for messages.
std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " and " : ", ";
    out += "'" + names[i] + "'";
  }
  return out;
}

// Makes `node` the gradient function of every floating output.
void MarkOutputs(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 std::vector<Tensor>& outs) {
  for (size_t o = 0; o < outs.size(); ++o) {
    if (!outs[o].defined() || !IsFloating(outs[o].dtype())) continue;
    // Autograd state lives in the implementation: an output that is one of
    // the inputs (an op returning its input unchanged) or an earlier output
    // gets a handle of its own, so the node does not rewrite their state.
    if (SharesImpl(outs[o], inputs, outs, o)) outs[o] = outs[o].detach();
    auto meta = std::make_shared<AutogradMeta>();
    meta->requires_grad = true;
    meta->grad_fn = node;
    meta->output_index = static_cast<int>(o);
    outs[o].set_autograd_meta(meta);
  }
}
}  // namespace

bool GradModeEnabled() { return g_grad_mode; }

LeafGradientWatch::LeafGradientWatch(Callback on_gradient)
    : on_gradient_(std::move(on_gradient)), previous_(g_leaf_gradient_watch) {
  g_leaf_gradient_watch = this;
}
LeafGradientWatch::~LeafGradientWatch() { g_leaf_gradient_watch = previous_; }
RecomputeScope::RecomputeScope() : previous_(g_recompute_region) {
  if (g_recompute_region < 0) g_recompute_region = g_recompute_regions_opened++;
}
RecomputeScope::~RecomputeScope() { g_recompute_region = previous_; }
int CurrentRecomputeRegion() { return g_recompute_region; }
bool InBackward() { return g_in_backward; }
LayerScope::LayerScope(int64_t layer) : previous_(g_layer) { g_layer = layer; }
LayerScope::~LayerScope() { g_layer = previous_; }
int64_t CurrentLayer() { return g_layer; }
NoGradGuard::NoGradGuard() : previous_(g_grad_mode) { g_grad_mode = false; }
NoGradGuard::~NoGradGuard() { g_grad_mode = previous_; }

Edge EdgeOf(const Tensor& t) {
  const std::shared_ptr<AutogradMeta> meta = t.autograd_meta();
  if (!meta || !meta->requires_grad) return {};
  if (meta->grad_fn) return {meta->grad_fn, meta->output_index, nullptr};
  return {nullptr, 0, meta};
}

bool Tensor::requires_grad() const { return impl_ && impl_->autograd && impl_->autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  TESSEL_CHECK(!requires_grad || IsFloating(dtype()))
      << "only floating tensors can require gradients; got " << ToString();
  std::shared_ptr<AutogradMeta>& meta = impl().autograd;
  if (!meta) meta = std::make_shared<AutogradMeta>();
  TESSEL_CHECK(!meta->grad_fn || requires_grad)
      << "cannot turn off requires_grad of a tensor computed by an op; use detach()";
  meta->requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const { return impl_ && impl_->autograd ? impl_->autograd->grad : Tensor(); }

void Tensor::set_grad(const Tensor& grad) {
  TESSEL_CHECK(requires_grad()) << "set_grad on a tensor that does not require grad: " << ToString();
  TESSEL_CHECK(!grad.defined() || grad.shape() == shape())
      << "set_grad: gradient of shape " << grad.shape() << " for a tensor of shape " << shape();
  impl_->autograd->grad = grad;
}

void Tensor::zero_grad() {
  if (impl_ && impl_->autograd) impl_->autograd->grad = Tensor();
}

void Tensor::backward() const { backward(Tensor()); }

void Tensor::backward(const Tensor& gradient) const {
  TESSEL_CHECK(requires_grad()) << "backward() on a tensor that does not require grad: " << ToString();
  Tensor seed = gradient;
  if (!seed.defined()) {
    TESSEL_CHECK(numel() == 1) << "backward() without a gradient needs a scalar; got shape " << shape()
                               << " (pass the gradient explicitly)";
    NoGradGuard no_grad;
    seed = fn::add_scalar(fn::mul_scalar(detach(), 0.0), 1.0);  // ones with this tensor's layout
  }
  TESSEL_CHECK(seed.shape() == shape())
      << "backward() gradient of shape " << seed.shape() << " for a tensor of shape " << shape();
  NoGradGuard no_grad;  // backward ops are not recorded (no double backward yet)
  struct InBackwardGuard {
    bool previous = g_in_backward;
    InBackwardGuard() { g_in_backward = true; }
    ~InBackwardGuard() { g_in_backward = previous; }
  } in_backward;
  Edge root = EdgeOf(*this);
  // Leaves that got a gradient, for a LeafGradientWatch.
  std::vector<AutogradMeta*> reached;
  auto add_to_leaf = [&](AutogradMeta& leaf, const Tensor& grad) {
    if (g_leaf_gradient_watch && std::find(reached.begin(), reached.end(), &leaf) == reached.end())
      reached.push_back(&leaf);
    leaf.grad = Accumulate(leaf.grad, grad);
  };
  auto tell_watch = [&] {
    if (g_leaf_gradient_watch)
      for (AutogradMeta* leaf : reached) g_leaf_gradient_watch->on_gradient_(leaf, leaf->grad);
  };
  if (root.leaf) {
    add_to_leaf(*root.leaf, seed);
    tell_watch();
    return;
  }
  // Count, for every reachable node, the edges that feed it.
  std::unordered_map<Node*, int> pending;
  std::vector<Node*> stack = {root.node.get()};
  std::unordered_set<Node*> seen = {root.node.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    TESSEL_CHECK(n->apply) << "backward through '" << n->name
                           << "' a second time; the graph is released after "
                           << "the first backward";
    for (const Edge& e : n->next) {
      if (!e.node) continue;
      ++pending[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  std::unordered_map<Node*, std::vector<Tensor>> grads;
  grads[root.node.get()].resize(root.node->num_outputs);
  grads[root.node.get()][root.output_index] = seed;
  std::vector<std::shared_ptr<Node>> ready = {root.node};
  while (!ready.empty()) {
    std::shared_ptr<Node> n = ready.back();
    ready.pop_back();
    LayerScope layer(n->layer);  // the gradient ops and their sums belong to the op's layer
    std::vector<Tensor> in_grads = n->apply(grads[n.get()]);
    grads.erase(n.get());
    n->apply = nullptr;  // release saved tensors: the graph is not retained
    for (size_t i = 0; i < n->next.size() && i < in_grads.size(); ++i) {
      const Edge& e = n->next[i];
      if (!e.valid()) continue;
      if (e.leaf) {
        if (in_grads[i].defined()) add_to_leaf(*e.leaf, in_grads[i]);
        continue;
      }
      auto& slot = grads[e.node.get()];
      if (slot.empty()) slot.resize(e.node->num_outputs);
      // The sum of an output's gradients belongs to the layer that made
      // the output, where that output lives: a value read by layers on
      // other stages (T5's encoder output, read by every decoder stage)
      // has its gradients summed on its own stage, not a reader's. A move
      // (to_global) leaves its output on the reader's side, where the
      // reader's layer keeps the sum.
      LayerScope sum_layer(e.node->name == "to_global" ? n->layer : e.node->layer);
      slot[e.output_index] = Accumulate(slot[e.output_index], in_grads[i]);
      if (--pending[e.node.get()] == 0) ready.push_back(e.node);
    }
  }
  tell_watch();
}

std::vector<Tensor> AutogradInterpreter::Apply(const OpDef& op, const std::vector<Tensor>& inputs,
                                               const Attrs& attrs) {
  if (!op.mutates.empty() && GradModeEnabled()) {
    for (int i : op.mutates) {
      TESSEL_CHECK(!inputs[i].requires_grad())
          << "op '" << op.name << "' updates its input " << op.input_name(i)
          << " in place, and that tensor requires gradients; update it under NoGradGuard (as the "
             "optimizers do) or pass tensor.detach()";
    }
  }
  std::vector<Tensor> outs = inner_.Apply(op, inputs, attrs);
  if (!GradModeEnabled() || op.not_differentiable || !op.mutates.empty()) return outs;
  auto node = std::make_shared<Node>();
  std::vector<bool> needs;
  bool any = false;
  for (const Tensor& t : inputs) {
    node->next.push_back(EdgeOf(t));
    needs.push_back(node->next.back().valid());
    any |= needs.back();
  }
  if (!any) return outs;
  node->name = op.name;
  node->layer = g_layer;
  node->num_outputs = static_cast<int>(outs.size());
  if (!op.grad) {
    // No gradient function and no mark that none is meant: a gradient
    // reaching this op fails, naming it, rather than stopping here unseen.
    std::vector<std::string> needing;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (needs[i]) needing.push_back(op.input_name(i));
    const std::string name = op.name, why = op.grad_unsupported;
    node->apply = [name, why, needing, n = inputs.size()](const std::vector<Tensor>& grad_outputs) {
      const bool reached =
          std::any_of(grad_outputs.begin(), grad_outputs.end(), [](const Tensor& g) { return g.defined(); });
      TESSEL_CHECK(!reached) << "backward(): op '" << name << "' has no gradient function"
                             << (why.empty() ? "" : " (" + why + ")") << ", and its input"
                             << (needing.size() > 1 ? "s " : " ") << JoinNames(needing)
                             << (needing.size() > 1 ? " need" : " needs")
                             << " a gradient (it depends on tensors that require gradients); detach it if "
                             << "nothing should flow back through '" << name << "'"
                             << (why.empty() ? ", or give the op a gradient (OpDef::grad)" : "");
      return std::vector<Tensor>(n);
    };
    MarkOutputs(node, inputs, outs);
    return outs;
  }
  // Detached: a node must not own its outputs' autograd state. Values the
  // gradient does not read are kept as metadata only.
  std::vector<Tensor> saved_in = KeepForGradient(inputs, op.saved ? &op.saved->inputs : nullptr);
  std::vector<Tensor> saved_out = KeepForGradient(outs, op.saved ? &op.saved->outputs : nullptr);
  const OpDef* def = &op;
  node->apply = [def, saved_in, saved_out, attrs, needs](const std::vector<Tensor>& grad_outputs) {
    GradContext ctx{saved_in, saved_out, grad_outputs, attrs, needs};
    std::vector<Tensor> grads = def->grad(ctx);
    // A gradient function that leaves out an input needing a gradient would
    // drop that path silently; it is a bug in the op, named here.
    const bool reached =
        std::any_of(grad_outputs.begin(), grad_outputs.end(), [](const Tensor& g) { return g.defined(); });
    for (size_t i = 0; reached && i < needs.size(); ++i) {
      TESSEL_CHECK(!needs[i] || (i < grads.size() && grads[i].defined()))
          << "backward(): the gradient of op '" << def->name << "' gave nothing for its input '"
          << def->input_name(i) << "', which needs a gradient";
    }
    // A gradient takes its tensor's layout when that costs nothing (a
    // local slice): data-parallel backward then stays split. Costly
    // conversions (a partial gradient's reduction) wait until needed.
    // Layout-change ops (OpDef::run) choose their gradients' layouts.
    for (size_t i = 0; !def->run && i < grads.size() && i < saved_in.size(); ++i) {
      Tensor& g = grads[i];
      const Tensor& x = saved_in[i];
      if (!g.defined() || !g.is_global() || !x.is_global()) continue;
      if (g.placement() != x.placement()) continue;
      const NdSbp want = GradientSbp(x.nd_sbp(), g.nd_sbp());
      if (g.nd_sbp() == want) continue;
      if (GetBoxingPlan(g.placement(), g.nd_sbp(), x.placement(), want, g.shape(), g.dtype())
              ->bytes_per_rank() == 0) {
        g = g.to_global(x.placement(), want);
      }
    }
    return grads;
  };
  MarkOutputs(node, inputs, outs);
  return outs;
}

}  // namespace tessel
