// Autograd's graph: nodes, edges and the per-tensor state. Internal to
// graph/ (not installed): users reach autograd through Tensor
// (requires_grad, backward, grad) and graph/autograd.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tessel {

struct Node;

// Where one input's gradient goes: an upstream node's output, or a leaf.
struct Edge {
  std::shared_ptr<Node> node;
  int output_index = 0;
  std::shared_ptr<AutogradMeta> leaf;
  bool valid() const { return node || leaf; }
};

struct Node {
  std::string name;  // the op, for messages
  int num_outputs = 1;
  int64_t layer = -1;  // CurrentLayer() when the op ran: its gradient ops run under it
  std::vector<Edge> next;  // one per op input
  // grad_outputs (undefined where none arrived) -> one gradient per input.
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> apply;  // released after backward
};

class AutogradMeta {
 public:
  bool requires_grad = false;
  Tensor grad;                    // leaves: the accumulated gradient
  std::shared_ptr<Node> grad_fn;  // non-leaves: the node that made the tensor
  int output_index = 0;
};

// The edge an op input contributes to a new node (invalid if none).
Edge EdgeOf(const Tensor& t);

}  // namespace tessel
