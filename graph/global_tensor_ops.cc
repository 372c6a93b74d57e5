#include "graph/global_tensor_ops.h"

#include <algorithm>
#include <sstream>

#include "core/comm/process_group.h"
#include "core/error.h"
#include "graph/autograd.h"
#include "graph/boxing_executor.h"

namespace tessel {

namespace {
// Records `out = to_global(in)` for autograd: the logical value is unchanged,
// so the gradient is the output's gradient laid out back like the input (for
// a local input: this rank's shard of it under the layout it was given).
void RecordLayoutChange(const Tensor& in, Tensor* out, const Placement& to, const NdSbp& to_sbp) {
  if (!GradModeEnabled() || !in.requires_grad()) return;
  auto node = std::make_shared<Node>();
  node->name = "to_global";
  node->next = {EdgeOf(in)};
  const bool was_global = in.is_global();
  const Placement from = was_global ? in.placement() : Placement();
  const NdSbp from_sbp = was_global ? in.nd_sbp() : NdSbp();
  node->apply = [was_global, from, from_sbp, to, to_sbp](const std::vector<Tensor>& grads) {
    const Tensor& g = grads.at(0);
    if (!was_global) return std::vector<Tensor>{g.to_global(to, to_sbp).to_local()};
    return std::vector<Tensor>{g.to_global(from, from_sbp)};
  };
  auto meta = std::make_shared<AutogradMeta>();
  meta->requires_grad = true;
  meta->grad_fn = node;
  out->set_autograd_meta(meta);
}
}  // namespace

Tensor Tensor::to_global(const Placement& placement, const NdSbp& nd_sbp) const {
  Tensor out;
  if (!is_global()) {
    out = FromLocal(*this, placement, nd_sbp);
  } else {
    CheckGlobalLayout(shape(), placement, nd_sbp);
    if (this->placement() == placement && this->nd_sbp() == nd_sbp) return *this;
    out = ExecuteBoxing(*this, GetBoxingPlan(this->placement(), this->nd_sbp(), placement, nd_sbp, shape(), dtype()));
  }
  RecordLayoutChange(*this, &out, placement, nd_sbp);
  return out;
}

namespace {
struct RankMeta {
  std::string layout;  // placement, NdSbp and dtype
  std::vector<int64_t> local_shape;
};

std::vector<RankMeta> ExchangeMeta(const RankMeta& mine) {
  comm::Communicator& world = comm::World();
  std::ostringstream os;
  os << mine.layout << "|";
  for (int64_t d : mine.local_shape) os << d << ",";
  std::string text = os.str();
  int64_t len = static_cast<int64_t>(text.size());
  std::vector<int64_t> lens(world.size());
  world.AllGather(&len, 1, lens.data(), DType::kInt64);
  std::vector<int64_t> counts(lens.begin(), lens.end());
  int64_t total = 0;
  for (int64_t l : lens) total += l;
  std::string all(static_cast<size_t>(total), '\0');
  world.AllGatherV(text.data(), all.data(), counts, DType::kBool);  // bytes
  std::vector<RankMeta> out;
  size_t pos = 0;
  for (int64_t l : lens) {
    std::string one = all.substr(pos, static_cast<size_t>(l));
    pos += static_cast<size_t>(l);
    size_t bar = one.rfind('|');
    RankMeta m{one.substr(0, bar), {}};
    std::istringstream dims(one.substr(bar + 1));
    std::string d;
    while (std::getline(dims, d, ',')) m.local_shape.push_back(std::stoll(d));
    out.push_back(std::move(m));
  }
  return out;
}
}  // namespace

Tensor FromLocal(const Tensor& local_in, const Placement& placement, const NdSbp& nd_sbp) {
  Tensor local = local_in.to_local();
  const int rank = CurrentRank();
  const Shape& ls = local.shape();
  placement.CheckInWorld(CurrentWorldSize());
  nd_sbp.Check(ls.ndim(), placement.ndim());
  std::string layout =
      placement.ToString() + " " + nd_sbp.ToString() + " " + std::string(DTypeName(local.dtype()));
  // Ranks outside the placement report no shard.
  std::vector<RankMeta> metas =
      ExchangeMeta({layout, placement.Contains(rank) ? ls.dims() : std::vector<int64_t>{}});
  // Everyone compares against rank 0, so every rank names the same culprits.
  std::string odd;
  for (size_t r = 1; r < metas.size(); ++r)
    if (metas[r].layout != metas[0].layout)
      odd += (odd.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " passed " + metas[r].layout);
  TESSEL_CHECK(odd.empty()) << "inconsistent global tensor metadata: " << odd << " but rank 0 passed "
                            << metas[0].layout
                            << "; every rank must give the same placement, NdSbp and dtype";
  // Logical size of dim d: sum of the shards along the mesh axes splitting
  // d (other axes at index 0); unsplit dims are the first member's.
  const int64_t nd = ls.ndim();
  auto shard_dims = [&](int index) -> const std::vector<int64_t>& {
    return metas[placement.ranks()[index]].local_shape;
  };
  for (int i = 0; i < placement.size(); ++i) {
    TESSEL_CHECK(static_cast<int64_t>(shard_dims(i).size()) == nd)
        << "inconsistent global tensor metadata: rank " << placement.ranks()[i] << " passed a shard of rank "
        << shard_dims(i).size() << " but rank " << rank << " one of rank " << nd;
  }
  std::vector<int64_t> logical(shard_dims(0));
  for (int64_t d = 0; d < nd; ++d) {
    std::vector<int> axes;
    for (int a = 0; a < nd_sbp.size(); ++a)
      if (nd_sbp[a].is_split(static_cast<int>(d))) axes.push_back(a);
    if (axes.empty()) continue;
    logical[d] = 0;
    for (int i = 0; i < placement.size(); ++i) {
      std::vector<int64_t> coord = placement.Coord(i);
      bool on_line = true;
      for (int a = 0; a < placement.ndim(); ++a) {
        bool splitting = std::find(axes.begin(), axes.end(), a) != axes.end();
        if (!splitting && coord[a] != 0) on_line = false;
      }
      if (on_line) logical[d] += shard_dims(i)[d];
    }
  }
  Shape logical_shape(logical);
  for (int i = 0; i < placement.size(); ++i) {
    Shape want = SliceOf(logical_shape, nd_sbp, placement.hierarchy(), placement.Coord(i)).shape();
    TESSEL_CHECK(Shape(shard_dims(i)) == want)
        << "inconsistent global tensor metadata: rank " << placement.ranks()[i] << " holds a shard of shape "
        << Shape(shard_dims(i)) << " but " << nd_sbp << " on " << placement << " of the logical shape "
        << logical_shape << " (inferred from all shards) gives it " << want;
  }
  if (!placement.Contains(rank))
    local = Tensor::Empty(LocalBox(logical_shape, placement, nd_sbp, rank).shape(), local.dtype());
  return MakeGlobal(local, logical_shape, placement, nd_sbp);
}

Tensor GatherLogical(const Tensor& global) {
  TESSEL_CHECK(global.is_global()) << "GatherLogical needs a global tensor, got " << global.ToString();
  const Placement& placement = global.placement();
  Tensor all = global.to_global(placement, NdSbp(std::vector<Sbp>(placement.ndim(), B())));
  return placement.Contains(CurrentRank()) ? all.to_local() : Tensor();
}

}  // namespace tessel
