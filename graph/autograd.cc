#include "graph/autograd.h"

#include <map>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "ops/functional.h"

namespace tessel {

namespace {
thread_local bool g_grad_mode = true;

// Sum of two gradients that may be undefined.
Tensor Accumulate(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return fn::add(a, b);
}
}  // namespace

bool GradModeEnabled() { return g_grad_mode; }
NoGradGuard::NoGradGuard() : previous_(g_grad_mode) { g_grad_mode = false; }
NoGradGuard::~NoGradGuard() { g_grad_mode = previous_; }

Edge EdgeOf(const Tensor& t) {
  const auto& meta = t.autograd_meta();
  if (!meta || !meta->requires_grad) return {};
  if (meta->grad_fn) return {meta->grad_fn, meta->output_index, nullptr};
  return {nullptr, 0, meta};
}

bool Tensor::requires_grad() const { return autograd_ && autograd_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  TESSEL_CHECK(!requires_grad || IsFloating(dtype_))
      << "only floating tensors can require gradients; got " << ToString();
  if (!autograd_) autograd_ = std::make_shared<AutogradMeta>();
  TESSEL_CHECK(!autograd_->grad_fn || requires_grad)
      << "cannot turn off requires_grad of a tensor computed by an op; use detach()";
  autograd_->requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const { return autograd_ ? autograd_->grad : Tensor(); }

void Tensor::zero_grad() {
  if (autograd_) autograd_->grad = Tensor();
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
  Edge root = EdgeOf(*this);
  if (root.leaf) {
    root.leaf->grad = Accumulate(root.leaf->grad, seed);
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
    std::vector<Tensor> in_grads = n->apply(grads[n.get()]);
    grads.erase(n.get());
    n->apply = nullptr;  // release saved tensors: the graph is not retained
    for (size_t i = 0; i < n->next.size() && i < in_grads.size(); ++i) {
      const Edge& e = n->next[i];
      if (!e.valid()) continue;
      if (e.leaf) {
        if (in_grads[i].defined()) e.leaf->grad = Accumulate(e.leaf->grad, in_grads[i]);
        continue;
      }
      auto& slot = grads[e.node.get()];
      if (slot.empty()) slot.resize(e.node->num_outputs);
      slot[e.output_index] = Accumulate(slot[e.output_index], in_grads[i]);
      if (--pending[e.node.get()] == 0) ready.push_back(e.node);
    }
  }
}

}  // namespace tessel
