#include "ops/functional.h"

#include <atomic>

#include "core/error.h"
#include "sbp/global_tensor.h"

namespace tessel {

namespace {
std::atomic<Interpreter*> g_interpreter{nullptr};
}

Interpreter* SetInterpreter(Interpreter* interpreter) { return g_interpreter.exchange(interpreter); }

std::vector<Tensor> ApplyOp(const std::string& name, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  const OpDef& op = GetOpDef(name);
  TESSEL_CHECK(op.variadic ? !inputs.empty() : inputs.size() == op.inputs.size())
      << "op '" << name << "' takes " << (op.variadic ? "at least 1" : std::to_string(op.inputs.size()))
      << " input(s), got " << inputs.size();
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
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm) {
  return One("permute", {x}, {{"perm", perm}});
}
Tensor slice(const Tensor& x, int64_t dim, int64_t begin, int64_t end) {
  return One("slice", {x}, {{"dim", dim}, {"begin", begin}, {"end", end}});
}
Tensor concat(const std::vector<Tensor>& xs, int64_t dim) { return One("concat", xs, {{"dim", dim}}); }
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  dim = x.shape().NormalizeAxis(dim);
  TESSEL_CHECK(total == x.shape()[dim]) << "split sizes add up to " << total << " but dimension " << dim
                                        << " of " << x.shape() << " has " << x.shape()[dim];
  std::vector<Tensor> parts;
  int64_t begin = 0;
  for (int64_t s : sizes) {
    parts.push_back(slice(x, dim, begin, begin + s));
    begin += s;
  }
  return parts;
}
Tensor exp(const Tensor& x) { return One("exp", {x}); }
Tensor log(const Tensor& x) { return One("log", {x}); }
Tensor max(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return One("max", {x}, {{"axes", axes}, {"keepdim", keepdim}});
}
Tensor scale_mask_softmax(const Tensor& x, const Tensor& mask, double scale, bool causal) {
  Tensor m = mask;
  if (!m.defined()) {  // keep everything: a broadcast `true`, local or global like x
    m = x.is_global() ? full(Shape{1}, 1.0, x.placement(), NdSbp(std::vector<Sbp>(x.placement().ndim(), B())),
                             DType::kBool)
                      : Tensor::FromVector<bool>({true}, Shape{1});
  }
  return One("scale_mask_softmax", {x, m}, {{"scale", scale}, {"causal", causal}});
}
Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return One("cast", {x}, {{"dtype", std::string(DTypeName(dtype))}});
}
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return One("where", {cond, a, b}); }
Tensor equal(const Tensor& a, const Tensor& b) { return One("equal", {a, b}); }
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return where(mask, add_scalar(mul_scalar(x, 0.0), value), x);
}
}  // namespace fn

}  // namespace tessel
