#include "ops/functional.h"

#include "core/bounded_cache.h"
#include "core/error.h"
#include "ops/interpreter.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

std::vector<Tensor> ApplyOp(const std::string& name, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  const OpDef& op = GetOpDef(name);
  TESSEL_CHECK(op.variadic ? !inputs.empty() : inputs.size() == op.inputs.size())
      << "op '" << name << "' takes " << (op.variadic ? "at least 1" : std::to_string(op.inputs.size()))
      << " input(s), got " << inputs.size();
  return CurrentInterpreter().Apply(op, inputs, attrs);
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
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return One("rms_norm", {x, weight}, {{"eps", eps}});
}
Tensor rotary(const Tensor& x, const Tensor& positions, const RotaryOptions& o) {
  Attrs attrs{{"theta", o.theta}, {"inverse", false}};
  if (o.scaling_factor > 0) {
    attrs.Set("scaling_factor", o.scaling_factor)
        .Set("low_freq_factor", o.low_freq_factor)
        .Set("high_freq_factor", o.high_freq_factor)
        .Set("original_max_positions", o.original_max_positions);
  }
  return One("rotary", {x, positions}, attrs);
}
Tensor swiglu(const Tensor& gate, const Tensor& up) { return One("swiglu", {gate, up}); }
Tensor expand(const Tensor& x, const Shape& shape, const std::vector<int64_t>& new_axes) {
  return One("expand", {x}, {{"shape", shape.dims()}, {"axes", new_axes}});
}
namespace {
bool ClassesSplit(const Tensor& logits) {
  if (!logits.is_global()) return false;
  for (const Sbp& s : logits.nd_sbp().sbps())
    if (s.is_split(1)) return true;
  return false;
}
}  // namespace

// Where `labels` equals ignore_index, laid out like labels.
Tensor Ignored(const Tensor& labels, int64_t ignore_index) {
  Tensor label_f = cast(labels, DType::kFloat32);
  return equal(label_f, add_scalar(mul_scalar(label_f, 0.0), static_cast<double>(ignore_index)));
}

// `x` (global) with its partial entries reduced: an all-reduce over the mesh
// axes where it is partial.
Tensor Reduced(const Tensor& x) { return x.to_global(x.placement(), x.nd_sbp().WithoutPartial()); }

Tensor cross_entropy_rows(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  if (!ClassesSplit(logits)) return One("cross_entropy", {logits, labels}, {{"ignore_index", ignore_index}});
  // Vocab-parallel form (Megatron's), logits never gathered: three
  // all-reduces of [N] vectors over the class-split ranks (the row max, the
  // sum of exponentials, the label's logit), each rank picking only the
  // labels in its columns. The max only steadies exp; the loss does not
  // depend on it, so it takes no gradient. bf16/f16 logits are widened to
  // f32 first (Megatron's logits.float()): the rows are f32 like the
  // cross_entropy op's, and the sum of exponentials and the all-reduces are
  // not rounded to 8 or 11 bits; the cast's gradient narrows dlogits back.
  const Tensor z = logits.dtype() == DType::kFloat32 ? logits : cast(logits, DType::kFloat32);
  Tensor m = Reduced(max(z.detach(), {1}, true));
  Tensor lse = add(log(Reduced(sum(exp(sub(z, m)), {1}))), reshape(m, {z.shape()[0]}));
  Tensor rows = sub(lse, Reduced(pick(z, labels, ignore_index)));
  return where(Ignored(labels, ignore_index), mul_scalar(rows, 0.0), rows);
}
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  // Mean over counted rows: sum(rows) / count, the count taken from labels.
  Tensor rows = cross_entropy_rows(logits, labels, ignore_index);
  if (!rows.is_global()) return One("masked_mean", {rows, labels}, {{"ignore_index", ignore_index}});
  // Global rows (split over data-parallel ranks): the sum and the count are
  // reduced as two scalars instead of gathering the rows. Ignored rows are
  // already 0, so when every row is ignored the loss is 0 / 1.
  Tensor zeros = mul_scalar(cast(labels, DType::kFloat32), 0.0);
  Tensor kept = where(Ignored(labels, ignore_index), zeros, add_scalar(zeros, 1.0));
  Tensor count = Reduced(sum(kept, {}));
  Tensor none = cast(equal(count, mul_scalar(count, 0.0)), DType::kFloat32);
  return div(Reduced(sum(rows, {})), add(count, none));
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
namespace {
// The mask that keeps everything: a broadcast `true`, local or global like
// x. Made once per placement (or device) of each rank and reused: making it
// copies a byte from the host, which on a GPU first waits for every kernel
// already queued. Not while building for planning (meta tensors) or tracing.
Tensor KeepAllMask(const Tensor& x) {
  auto make = [&x] {
    return x.is_global() ? full(Shape{1}, 1.0, x.placement(),
                                NdSbp(std::vector<Sbp>(x.placement().ndim(), B())), DType::kBool)
                         : Tensor::FromVector<bool>({true}, Shape{1}).To(x.device());
  };
  if (InMetaWorld() || x.is_lazy() || IsTracing()) return make();
  static BoundedCache<std::string, Tensor> masks(64);
  const std::string key = std::to_string(CurrentRank()) + "/" + std::to_string(CurrentWorldSize()) + "/" +
                          (x.is_global() ? "p" + std::to_string(x.placement().id()) : x.device().ToString());
  if (std::optional<Tensor> m = masks.Get(key)) return *m;
  Tensor m = make();
  masks.Put(key, m);
  return m;
}
}  // namespace

Tensor scale_mask_softmax(const Tensor& x, const Tensor& mask, double scale, bool causal) {
  const Tensor m = mask.defined() ? mask : KeepAllMask(x);
  return One("scale_mask_softmax", {x, m}, {{"scale", scale}, {"causal", causal}});
}
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return One("linear", {x, weight, bias});
}
Tensor linear_gelu_tanh(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return ApplyOp("linear_gelu_tanh", {x, weight, bias}, {})[0];
}
Tensor linear_residual(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual) {
  return One("linear_residual", {x, weight, bias, residual});
}
std::vector<Tensor> linear_weight_grad(const Tensor& x, const Tensor& dy) {
  return ApplyOp("linear_weight_grad", {x, dy}, {});
}
std::vector<Tensor> split_qkv(const Tensor& x) { return ApplyOp("split_qkv", {x}, {}); }
Tensor merge_qkv(const Tensor& q, const Tensor& k, const Tensor& v) { return One("merge_qkv", {q, k, v}); }
Tensor qkv_attention(const Tensor& x, double scale, bool causal) {
  return ApplyOp("qkv_attention", {x}, {{"scale", scale}, {"causal", causal}})[0];
}
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal) {
  return One("attention", {q, k, v}, {{"scale", scale}, {"causal", causal}});
}
Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return One("cast", {x}, {{"dtype", std::string(DTypeName(dtype))}});
}
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return One("where", {cond, a, b}); }
Tensor equal(const Tensor& a, const Tensor& b) { return One("equal", {a, b}); }
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  // A broadcast scalar, not x * 0 + value (which is NaN where x is inf).
  Tensor v = x.is_global() ? full(Shape{1}, value, x.placement(),
                                  NdSbp(std::vector<Sbp>(x.placement().ndim(), B())), x.dtype())
                           : full(Shape{1}, value, x.dtype(), x.device());
  return where(mask, v, x);
}
Tensor sqrt(const Tensor& x) { return One("sqrt", {x}); }
Tensor dropout(const Tensor& x, const Tensor& offset, double p, int64_t seed) {
  if (p == 0) return x;
  return One("dropout", {x, offset}, {{"p", p}, {"seed", seed}});
}
Tensor dropout(const Tensor& x, double p, int64_t seed, int64_t offset) {
  if (p == 0) return x;
  return dropout(x, ReplicatedInt64(offset, x), p, seed);
}
Tensor rng_offset(const Tensor& counter, const Tensor& like) { return One("rng_offset", {counter, like}); }
Tensor rng_advance(const Tensor& counter, const Tensor& like) {
  return ApplyOp("rng_advance", {counter, like}, {}).at(0);
}
Tensor embedding(const Tensor& table, const Tensor& ids, int64_t padding_idx) {
  return One("embedding", {table, ids}, {{"padding_idx", padding_idx}});
}
Tensor pick(const Tensor& x, const Tensor& labels, int64_t ignore_index) {
  return One("pick", {x, labels}, {{"ignore_index", ignore_index}});
}
Tensor patchify(const Tensor& images, int64_t patch) { return One("patchify", {images}, {{"patch", patch}}); }
Tensor global_norm(const std::vector<Tensor>& xs) {
  TESSEL_CHECK(!xs.empty()) << "global_norm of no tensors";
  // Sums of squares are added per placement first (a split tensor's sum is a
  // partial, added to the others without communicating), so only one scalar
  // per placement (pipeline stage) moves to the first placement.
  std::vector<Tensor> per_placement;
  for (const Tensor& x : xs) {
    Tensor sq = sum(mul(x, x), {});
    bool added = false;
    for (Tensor& t : per_placement) {
      if (!sq.is_global() || !t.is_global() || t.placement() == sq.placement()) {
        t = add(t, sq);
        added = true;
        break;
      }
    }
    if (!added) per_placement.push_back(sq);
  }
  Tensor total = per_placement[0];
  for (size_t i = 1; i < per_placement.size(); ++i) {
    total = add(total, per_placement[i].to_global(total.placement(),
                                                  NdSbp(std::vector<Sbp>(total.placement().ndim(), B()))));
  }
  return sqrt(total);
}
std::vector<Tensor> adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                 const Tensor& exp_avg_sq, const Tensor& step, const Tensor& lr,
                                 const AdamWOptions& o) {
  return ApplyOp("adamw_update", {param, grad, exp_avg, exp_avg_sq, step, lr},
                 {{"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}});
}
Tensor assign(const Tensor& dst, const Tensor& src) { return ApplyOp("assign", {dst, src}, {}).at(0); }
std::vector<Tensor> sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                               double lr, double momentum, double weight_decay, bool first_step) {
  return ApplyOp("sgd_update", {param, grad, momentum_buffer},
                 {{"lr", lr}, {"momentum", momentum}, {"weight_decay", weight_decay}, {"first", first_step}});
}
}  // namespace fn

}  // namespace tessel
