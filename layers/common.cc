#include "layers/common.h"

#include "core/error.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::layers {

Tensor ToHidden(const Tensor& x, const Placement& placement) {
  const NdSbp layout = dist::BatchInputSbp(x.ndim());
  if (!x.is_global()) {
    // A local tensor is the whole (replicated) value on every rank: its
    // shape is the logical shape (nothing to exchange).
    return FromLocal(x, placement, dist::GetNdSbp({B(), B()}), x.shape()).to_global(placement, layout);
  }
  return x.to_global(placement, layout);
}

Tensor ToActivations(const Tensor& x, const Placement& placement) {
  // A global tensor moves (between pipeline stages) in the layout it keeps
  // there: a same-layout hop, as between the stages' hidden states without
  // sequence parallelism.
  if (x.is_global()) return x.to_global(placement, dist::GetActivationSbp(x.ndim()));
  return ToHidden(x, placement).to_global(placement, dist::GetActivationSbp(x.ndim()));
}

Tensor OnPlacement(const Tensor& x, const Placement& placement) {
  if (!x.defined()) return x;
  if (!x.is_global()) return FromLocal(x, placement, dist::GetNdSbp({B(), B()}), x.shape());
  return x.placement() == placement ? x : x.to_global(placement, x.nd_sbp());
}

void CheckTokenInputs(const char* model, const Tensor& ids, const Tensor& position_ids,
                      const Tensor& attention_mask, int64_t max_seq) {
  TESSEL_CHECK(ids.ndim() == 2) << model << ": ids of shape " << ids.shape() << "; expected [batch, seq]";
  TESSEL_CHECK(ids.shape()[1] <= max_seq)
      << model << ": sequence of " << ids.shape()[1] << " tokens exceeds max_seq=" << max_seq;
  for (const Tensor* t : {&position_ids, &attention_mask})
    TESSEL_CHECK(!t->defined() || t->shape() == ids.shape())
        << model << ": " << (t == &position_ids ? "position_ids" : "attention_mask") << " of shape "
        << t->shape() << "; expected the ids' shape " << ids.shape();
}

Tensor PositionsOrRange(const Tensor& position_ids, int64_t seq) {
  if (position_ids.defined()) return position_ids;
  std::vector<int64_t> range(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) range[static_cast<size_t>(i)] = i;
  return Tensor::FromVector<int64_t>(range, {seq});
}

Tensor ForCompute(const Tensor& param) {
  if (!param.is_global()) return param;
  const dist::Config& c = dist::GetConfig();
  if (c.data_parallel_size <= 1 || c.zero_stage < 2) return param;
  const NdSbp& stored = param.nd_sbp();
  if (c.zero_stage >= 3) {
    if (!stored[0].is_split()) return param;  // too small to split: kept whole
    std::vector<Sbp> gathered = stored.sbps();
    gathered[0] = B();
    return param.to_global(param.placement(), NdSbp(gathered), stored);
  }
  const NdSbp shard = dist::ZeroShardSbp(param.shape(), stored);
  if (shard == stored) return param;
  return param.to_global(param.placement(), stored, shard);
}

Tensor GatheredForCompute(const Tensor& param, const NdSbp& compute) {
  NdSbp grad = param.nd_sbp();
  if (dist::GetConfig().data_parallel_size > 1 && grad[0].is_broadcast()) grad[0] = P();
  return param.to_global(param.placement(), compute, grad);
}

Tensor ReducedInto(const Tensor& y, const NdSbp& out) {
  if (!y.nd_sbp().has_partial()) return y.to_global(y.placement(), out);
  return y.to_global(y.placement(), out, y.nd_sbp().WithoutPartial());
}

}  // namespace tessel::layers
