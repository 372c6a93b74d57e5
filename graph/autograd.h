// Reverse-mode autograd. Every differentiable op application records a Node
// whose backward function is the op's gradient (ops/defs), written with
// functional ops: the same graph differentiates local and global tensors,
// and gradients of global tensors come out global with the SBP the
// backward ops infer (a B weight used with S(0) data gets a P gradient,
// reduced only when something needs it reduced).
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"
#include "ops/interpreter.h"

namespace tessel {

// Gradient recording is on unless a NoGradGuard is alive on this thread.
bool GradModeEnabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// While alive, on this thread: at the end of each backward(), `on_gradient`
// gets every leaf that backward gave a gradient, in the order they first got
// one, with the leaf's accumulated gradient (its grad()); `leaf` identifies
// the leaf across calls. A graph trace uses it to learn which traced values
// are the variables' gradients (gradient accumulation cuts a step there).
class LeafGradientWatch {
 public:
  using Callback = std::function<void(const void* leaf, const Tensor& grad)>;
  explicit LeafGradientWatch(Callback on_gradient);
  ~LeafGradientWatch();
  LeafGradientWatch(const LeafGradientWatch&) = delete;
  LeafGradientWatch& operator=(const LeafGradientWatch&) = delete;

 private:
  friend class Tensor;
  Callback on_gradient_;
  LeafGradientWatch* previous_;
};

// Activation checkpointing: the ops recorded while a RecomputeScope is
// alive on this thread form one region. A traced step (graph mode) keeps
// only what flows into the region for backward and recomputes the region's
// activations there (graph/passes: activation_checkpointing), trading a
// second forward of the region for its memory. Eager mode keeps its
// activations (the scope changes nothing there). A scope opened inside
// another joins the outer one's region.
class RecomputeScope {
 public:
  RecomputeScope();
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  int previous_;
};
// The region ops recorded now belong to; -1 outside every RecomputeScope.
int CurrentRecomputeRegion();

// Whether this thread is inside backward(): the ops applied now are
// gradient ops (a tracer marks them so).
bool InBackward();

// The model layer (its layer_idx) whose code runs while a LayerScope is
// alive on this thread. A tracer tags the ops it records with it, and
// autograd hands it to the gradient ops of those ops, so a compiled plan
// can say what each layer costs (ir::Op::layer; tessel-plan's per-layer
// table). Nothing else depends on it.
class LayerScope {
 public:
  explicit LayerScope(int64_t layer);
  ~LayerScope();
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;

 private:
  int64_t previous_;
};
// The layer of the innermost LayerScope; -1 outside every one.
int64_t CurrentLayer();

// Autograd as a layer: applies each op through `inner`, then, when an input
// requires a gradient and grad mode is on, records a node whose backward is
// the op's gradient function (ops/defs). The node keeps only what the op
// declares its gradient reads (OpDef::saved); the rest is kept as metadata.
// Under a lazy interpreter the same layer records the traced graph's
// backward.
class AutogradInterpreter final : public Interpreter {
 public:
  explicit AutogradInterpreter(Interpreter& inner) : inner_(inner) {}
  std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) override;
  bool records() const override { return inner_.records(); }

 private:
  Interpreter& inner_;
};

}  // namespace tessel
