#include "ops/functional.h"

#include <atomic>

#include "core/error.h"

namespace tessel {

namespace {
std::atomic<Interpreter*> g_interpreter{nullptr};
}

Interpreter* SetInterpreter(Interpreter* interpreter) { return g_interpreter.exchange(interpreter); }

std::vector<Tensor> ApplyOp(const std::string& name, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  const OpDef& op = GetOpDef(name);
  TESSEL_CHECK(inputs.size() == op.inputs.size())
      << "op '" << name << "' takes " << op.inputs.size() << " input(s), got " << inputs.size();
  Interpreter* interpreter = g_interpreter.load();
  TESSEL_CHECK_CODE(interpreter != nullptr, StatusCode::kInternal)
      << "no interpreter installed for op '" << name << "'; link tessel::graph (tessel::tessel)";
  return interpreter->Apply(op, inputs, attrs);
}

namespace fn {
namespace {
Tensor One(const std::string& name, const std::vector<Tensor>& inputs, const Attrs& attrs = {}) {
  return ApplyOp(name, inputs, attrs).at(0);
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return One("matmul", {a, b}, {{"transpose_a", ta}, {"transpose_b", tb}});
}
Tensor add(const Tensor& a, const Tensor& b) { return One("add", {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return One("sub", {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return One("mul", {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return One("div", {a, b}); }
Tensor add_scalar(const Tensor& a, double s) { return One("add_scalar", {a}, {{"scalar", s}}); }
Tensor mul_scalar(const Tensor& a, double s) { return One("mul_scalar", {a}, {{"scalar", s}}); }
Tensor relu(const Tensor& x) { return One("relu", {x}); }
Tensor gelu(const Tensor& x) { return One("gelu", {x}); }
Tensor gelu_tanh(const Tensor& x) { return One("gelu_tanh", {x}); }
Tensor tanh(const Tensor& x) { return One("tanh", {x}); }
Tensor neg(const Tensor& x) { return One("neg", {x}); }
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return One("sum", {x}, {{"axes", axes}, {"keepdim", keepdim}});
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return One("mean", {x}, {{"axes", axes}, {"keepdim", keepdim}});
}
Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return One("sum_to", {x}, {{"shape", shape.dims()}});
}
Tensor softmax(const Tensor& x) { return One("softmax", {x}); }
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  return One("layer_norm", {x, gamma, beta}, {{"eps", eps}});
}
Tensor cross_entropy_rows(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  return One("cross_entropy", {logits, labels}, {{"ignore_index", ignore_index}});
}
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  // Mean over counted rows: sum(rows) / count, the count taken from labels.
  Tensor rows = cross_entropy_rows(logits, labels, ignore_index);
  return One("masked_mean", {rows, labels}, {{"ignore_index", ignore_index}});
}
Tensor reshape(const Tensor& x, const Shape& shape) { return One("reshape", {x}, {{"shape", shape.dims()}}); }
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  return One("transpose", {x}, {{"dim0", dim0}, {"dim1", dim1}});
}
}  // namespace fn

}  // namespace tessel
