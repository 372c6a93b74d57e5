// matmul: a [..., m, k] x b [..., k, n], optional transposes, broadcast batch.
#include "ops/cpu/broadcast.h"
#include "ops/cpu/gemm.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/gemm.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

std::vector<TensorSpec> Infer(const std::vector<TensorSpec>& in, const Attrs& a) {
  const Shape &sa = in[0].shape, &sb = in[1].shape;
  defs::CheckFloat("matmul", in[0], "a");
  defs::CheckFloat("matmul", in[1], "b");
  TESSEL_CHECK(in[0].dtype == in[1].dtype)
      << "matmul: a is " << in[0].dtype << " but b is " << in[1].dtype << "; cast one (fn::cast)";
  TESSEL_CHECK(sa.ndim() >= 2 && sb.ndim() >= 2)
      << "matmul needs operands of rank >= 2; got " << sa << " and " << sb;
  bool ta = a.Get<bool>("transpose_a"), tb = a.Get<bool>("transpose_b");
  int64_t m = ta ? sa[-1] : sa[-2], ka = ta ? sa[-2] : sa[-1];
  int64_t kb = tb ? sb[-1] : sb[-2], n = tb ? sb[-2] : sb[-1];
  TESSEL_CHECK(ka == kb) << "matmul: inner sizes differ: a " << sa << (ta ? "^T" : "") << " x b " << sb
                         << (tb ? "^T" : "") << " (" << ka << " vs " << kb << ")";
  Shape batch = cpu::BroadcastShapes(Shape(std::vector<int64_t>(sa.dims().begin(), sa.dims().end() - 2)),
                                     Shape(std::vector<int64_t>(sb.dims().begin(), sb.dims().end() - 2)));
  std::vector<int64_t> dims = batch.dims();
  dims.push_back(m);
  dims.push_back(n);
  return {{Shape(dims), in[0].dtype}};
}

// Row-parallel and column-parallel forms, the partial-sum form, batch splits.
std::vector<SbpSignature> Signatures(const std::vector<TensorSpec>& in, const Attrs& a) {
  const int64_t ra = in[0].shape.ndim(), rb = in[1].shape.ndim();
  const int64_t ro = std::max(ra, rb);
  bool ta = a.Get<bool>("transpose_a"), tb = a.Get<bool>("transpose_b");
  const int am = static_cast<int>(ta ? ra - 1 : ra - 2), ak = static_cast<int>(ta ? ra - 2 : ra - 1);
  const int bk = static_cast<int>(tb ? rb - 1 : rb - 2), bn = static_cast<int>(tb ? rb - 2 : rb - 1);
  std::vector<SbpSignature> out = {
      {{S(am), B()}, {S(static_cast<int>(ro - 2))}},
      {{B(), S(bn)}, {S(static_cast<int>(ro - 1))}},
      {{S(ak), S(bk)}, {P()}},
      {{P(), B()}, {P()}},
      {{B(), P()}, {P()}},
  };
  // Batch dimensions split together when both operands have them.
  for (int64_t d = 0; d < ro - 2; ++d) {
    int64_t da = d - (ro - ra), db = d - (ro - rb);
    if (da >= 0 && db >= 0 && in[0].shape.dims()[da] == in[1].shape.dims()[db]) {
      out.push_back({{S(static_cast<int>(da)), S(static_cast<int>(db))}, {S(static_cast<int>(d))}});
    } else if (da >= 0 && db < 0) {
      out.push_back({{S(static_cast<int>(da)), B()}, {S(static_cast<int>(d))}});
    }
  }
  return out;
}

// x's leading dims merge into its rows without moving data: x is local, or
// each of its splits is on the first dim (into equal parts, so each shard's
// rows stay one block) or on the last.
bool FoldsBatchInPlace(const Tensor& x) {
  if (!x.is_global()) return true;
  const std::vector<Sbp>& sbps = x.nd_sbp().sbps();
  int64_t first_parts = 1;
  for (size_t axis = 0; axis < sbps.size(); ++axis) {
    if (!sbps[axis].is_split() || sbps[axis].axis() == x.ndim() - 1) continue;
    if (sbps[axis].axis() != 0) return false;
    first_parts *= x.placement().hierarchy()[axis];
  }
  return x.shape()[0] % first_parts == 0;
}

std::vector<Tensor> Grad(const GradContext& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1], &g = c.grad_outputs[0];
  bool ta = c.attrs.Get<bool>("transpose_a"), tb = c.attrs.Get<bool>("transpose_b");
  Tensor da, db;
  if (c.needs_input_grad[0]) {
    da = ta ? fn::matmul(b, g, tb, true) : fn::matmul(g, b, false, !tb);
    da = fn::sum_to(da, a.shape());
  }
  if (c.needs_input_grad[1]) {
    if (b.ndim() == 2 && a.ndim() > 2 && !ta && FoldsBatchInPlace(a) && FoldsBatchInPlace(g)) {
      // A weight shared by every batch: fold the batch into the rows and
      // take one GEMM instead of batched GEMMs plus a sum over the batch.
      const int64_t k = a.shape()[-1], n = g.shape()[-1], rows = a.numel() / k;
      Tensor a2 = fn::reshape(a, {rows, k}), g2 = fn::reshape(g, {rows, n});
      db = tb ? fn::matmul(g2, a2, true, false) : fn::matmul(a2, g2, true, false);
    } else {
      db = tb ? fn::matmul(g, a, true, ta) : fn::matmul(a, g, !ta, false);
      db = fn::sum_to(db, b.shape());
    }
  }
  return {da, db};
}

}  // namespace

void RegisterMatmulOps() {
  OpDef def;
  def.name = "matmul";
  def.inputs = {"a", "b"};
  def.infer = Infer;
  def.sbp = Signatures;
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cpu::Matmul(in[0], in[1], a.Get<bool>("transpose_a"), a.Get<bool>("transpose_b"))};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cuda::Matmul(in[0], in[1], a.Get<bool>("transpose_a"), a.Get<bool>("transpose_b"))};
  };
#endif
  def.saved = OpDef::SavedForGrad{{0, 1}, {}};  // the gradient reads a and b, not the product
  def.grad = Grad;
  RegisterOp(std::move(def));
}

}  // namespace tessel
