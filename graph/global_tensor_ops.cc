#include "graph/global_tensor_ops.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "core/comm/flight_recorder.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/init.h"
#include "graph/autograd.h"
#include "graph/boxing_executor.h"
#include "ops/functional.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

namespace {

// The gradient of a layout change: the logical value is unchanged, so the
// input's gradient is the output's gradient laid out back like the input
// (for a local input: this rank's shard of it under the layout it was
// given). `grad_sbp`, when set, is the layout the gradient is brought to
// instead (on the input's placement): a column-parallel input asks for B
// there, which is Megatron's all-reduce of the input gradient. The input is
// kept as metadata only.
std::vector<Tensor> LayoutChangeGrad(const GradContext& c) {
  const Tensor& g = c.grad_outputs.at(0);
  if (!g.defined() || !c.needs_input_grad[0]) return {Tensor()};
  const Tensor& in = c.inputs[0];
  const Placement to = Placement::Parse(c.attrs.Get<std::string>("placement"));
  const NdSbp to_sbp = NdSbp::Parse(c.attrs.Get<std::string>("nd_sbp"));
  const bool forced = c.attrs.Has("grad_sbp");
  const NdSbp forced_sbp = forced ? NdSbp::Parse(c.attrs.Get<std::string>("grad_sbp")) : NdSbp();
  if (!in.is_global()) return {g.to_global(to, forced ? forced_sbp : to_sbp).to_local()};
  if (forced) return {g.to_global(in.placement(), forced_sbp)};
  const NdSbp want =
      g.placement() == in.placement() ? GradientSbp(in.nd_sbp(), g.nd_sbp()) : in.nd_sbp().WithoutPartial();
  return {g.to_global(in.placement(), want)};
}

Tensor FromLocalImpl(const Tensor& local_in, const Placement& placement, const NdSbp& nd_sbp,
                     const Shape* given_shape);

// to_global (a global input to another layout) and from_local (a local
// shard to a global tensor) are ops, so that any interpreter sees them: the
// eager one runs them at once (OpDef::run: they communicate, there is no
// kernel), a tracer records them, autograd differentiates them like any op.
void RegisterLayoutOps() {
  OpDef to_global;
  to_global.name = "to_global";
  to_global.inputs = {"x"};
  to_global.infer = [](const std::vector<TensorSpec>& in, const Attrs&) { return in; };
  to_global.run = [](const std::vector<Tensor>& in, const Attrs& a) {
    TESSEL_CHECK(in[0].is_global()) << "to_global op on a local tensor " << in[0].ToString()
                                    << "; local tensors become global through from_local";
    return std::vector<Tensor>{BoxTo(in[0], Placement::Parse(a.Get<std::string>("placement")),
                                     NdSbp::Parse(a.Get<std::string>("nd_sbp")))};
  };
  to_global.saved = OpDef::SavedForGrad{};  // the input's layout only
  to_global.grad = LayoutChangeGrad;
  to_global.communicates = true;
  RegisterOp(std::move(to_global));

  OpDef from_local;
  from_local.name = "from_local";
  from_local.inputs = {"local"};
  // The logical shape when given; otherwise it is only known after the
  // ranks exchange their shard shapes (eager), so a tracer must be given it.
  from_local.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    if (!a.Has("shape")) return in;
    return std::vector<TensorSpec>{{Shape(a.Get<std::vector<int64_t>>("shape")), in[0].dtype}};
  };
  from_local.run = [](const std::vector<Tensor>& in, const Attrs& a) {
    const Placement placement = Placement::Parse(a.Get<std::string>("placement"));
    const NdSbp nd_sbp = NdSbp::Parse(a.Get<std::string>("nd_sbp"));
    if (!a.Has("shape")) return std::vector<Tensor>{FromLocalImpl(in[0], placement, nd_sbp, nullptr)};
    const Shape shape(a.Get<std::vector<int64_t>>("shape"));
    return std::vector<Tensor>{FromLocalImpl(in[0], placement, nd_sbp, &shape)};
  };
  from_local.view = true;  // this rank's shard is the local tensor itself
  from_local.saved = OpDef::SavedForGrad{};
  from_local.grad = LayoutChangeGrad;
  from_local.communicates = true;
  RegisterOp(std::move(from_local));
}

Tensor ToGlobal(const Tensor& in, const Placement& placement, const NdSbp& nd_sbp, const NdSbp* grad_sbp) {
  EnsureLayoutOps();
  if (!in.is_global()) return ApplyOp("from_local", {in}, LayoutAttrs(placement, nd_sbp, grad_sbp)).at(0);
  if (in.placement() == placement && in.nd_sbp() == nd_sbp &&
      (grad_sbp == nullptr || !GradModeEnabled() || !in.requires_grad())) {
    // Checks (and agrees with the other ranks) only: nothing moves. A lazy
    // tensor's layout was checked when it was traced.
    if (!in.is_lazy()) BoxTo(in, placement, nd_sbp);
    return in;  // the same tensor, autograd identity included
  }
  if (grad_sbp != nullptr) CheckGlobalLayout(in.shape(), in.placement(), *grad_sbp);
  return ApplyOp("to_global", {in}, LayoutAttrs(placement, nd_sbp, grad_sbp)).at(0);
}
}  // namespace

void EnsureLayoutOps() {
  static const bool registered = (RegisterLayoutOps(), true);
  (void)registered;
}

Attrs LayoutAttrs(const Placement& placement, const NdSbp& nd_sbp, const NdSbp* grad_sbp) {
  Attrs a{{"placement", placement.ToString()}, {"nd_sbp", nd_sbp.ToString()}};
  if (grad_sbp != nullptr) a.Set("grad_sbp", grad_sbp->ToString());
  return a;
}

Tensor Tensor::to_global(const Placement& placement, const NdSbp& nd_sbp) const {
  return ToGlobal(*this, placement, nd_sbp, nullptr);
}

Tensor Tensor::to_global(const Placement& placement, const NdSbp& nd_sbp, const NdSbp& grad_sbp) const {
  return ToGlobal(*this, placement, nd_sbp, &grad_sbp);
}

namespace {
// Every rank's `text`, in world-rank order (a collective over the world).
std::vector<std::string> AllGatherText(const std::string& text) {
  comm::Communicator& world = comm::World();
  int64_t len = static_cast<int64_t>(text.size());
  std::vector<int64_t> lens(world.size());
  world.AllGather(&len, 1, lens.data(), DType::kInt64);
  int64_t total = 0;
  for (int64_t l : lens) total += l;
  std::string all(static_cast<size_t>(total), '\0');
  world.AllGatherV(text.data(), all.data(), lens, DType::kBool);  // bytes
  std::vector<std::string> out;
  size_t pos = 0;
  for (int64_t l : lens) {
    out.push_back(all.substr(pos, static_cast<size_t>(l)));
    pos += static_cast<size_t>(l);
  }
  return out;
}

uint64_t Fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: the same on every rank and build
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// What one rank tells the others in FromLocal's metadata exchange.
struct RankMeta {
  std::string layout;                // placement, NdSbp and dtype
  std::vector<int64_t> local_shape;  // empty for ranks outside the placement
  std::string problem;               // why this rank's input is unusable, if it is
};

std::vector<RankMeta> ExchangeMeta(const RankMeta& mine) {
  std::ostringstream os;
  os << mine.problem << '\n' << mine.layout << '\n';
  for (int64_t d : mine.local_shape) os << d << ",";
  std::vector<RankMeta> out;
  for (const std::string& one : AllGatherText(os.str())) {
    size_t a = one.find('\n'), b = one.find('\n', a + 1);
    RankMeta m{one.substr(a + 1, b - a - 1), {}, one.substr(0, a)};
    std::istringstream dims(one.substr(b + 1));
    std::string d;
    while (std::getline(dims, d, ',')) m.local_shape.push_back(std::stoll(d));
    out.push_back(std::move(m));
  }
  return out;
}

// The logical size of dimension `d` that the most members' shards agree
// with, and those members: the sum of the shards along the splitting mesh
// axes is tried first, then, for every member's shard, the sizes a balanced
// split could have cut it from. So one rank with a wrong shard is the one
// named, not a rank whose shard only looks wrong against a bad sum.
int64_t InferSplitDim(int64_t d, const std::vector<std::vector<int64_t>>& shards, const Placement& placement,
                      const NdSbp& nd_sbp, const std::vector<int64_t>& others) {
  std::vector<int> axes;
  int64_t parts = 1;
  for (int a = 0; a < nd_sbp.size(); ++a) {
    if (nd_sbp[a].is_split(static_cast<int>(d))) {
      axes.push_back(a);
      parts *= placement.hierarchy()[a];
    }
  }
  int64_t sum = 0;
  for (int i = 0; i < placement.size(); ++i) {
    std::vector<int64_t> coord = placement.Coord(i);
    bool on_line = true;
    for (int a = 0; a < placement.ndim(); ++a)
      if (std::find(axes.begin(), axes.end(), a) == axes.end() && coord[a] != 0) on_line = false;
    if (on_line) sum += shards[i][d];
  }
  auto matches = [&](int64_t size) {
    std::vector<int64_t> dims = others;
    dims[d] = size;
    int count = 0;
    for (int i = 0; i < placement.size(); ++i)
      count +=
          SliceOf(Shape(dims), nd_sbp, placement.hierarchy(), placement.Coord(i)).shape()[d] == shards[i][d];
    return count;
  };
  int64_t best = sum;
  int best_count = matches(sum);
  for (int i = 0; i < placement.size() && best_count < placement.size(); ++i) {
    for (int64_t j = 0; j < parts; ++j) {
      const int64_t candidate = shards[i][d] * parts + j;
      const int count = matches(candidate);
      if (count > best_count) best = candidate, best_count = count;
    }
  }
  return best;
}

Tensor FromLocalImpl(const Tensor& local_in, const Placement& placement, const NdSbp& nd_sbp,
                     const Shape* given_shape) {
  const int rank = CurrentRank();
  placement.CheckInWorld(CurrentWorldSize());
  const bool member = placement.Contains(rank);
  // Without the logical shape the ranks exchange their shards' shapes and
  // layouts (one small all-gather): a split's size is learnt from them, a
  // rank outside the placement learns the shape it holds nothing of (it may
  // pass an empty shard, or none), and ranks that disagree are named before
  // any data moves. A given logical shape says what every shard is: nothing
  // is exchanged (per-step inputs) unless lockstep checks are on.
  // (A world of one has no one to disagree with: its shard is the tensor.)
  const bool exchange = CurrentWorldSize() > 1 && (LockstepChecksEnabled() || given_shape == nullptr);
  std::string problem;
  Tensor local = local_in.defined() ? local_in.to_local() : Tensor();
  if (!local.defined() && (member || (given_shape == nullptr && !exchange))) {
    problem =
        member
            ? "passed an undefined tensor as its shard"
            : "is outside the placement and passed no tensor, so the logical shape is unknown (pass one, or "
              "the logical shape)";
  }
  if (problem.empty() && local.defined()) {
    try {
      nd_sbp.Check(local.ndim(), placement.ndim());
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  Shape own_shape = local.defined() ? local.shape() : Shape();
  if (problem.empty() && given_shape != nullptr && member) {
    Shape want =
        SliceOf(*given_shape, nd_sbp, placement.hierarchy(), placement.Coord(placement.IndexOf(rank)))
            .shape();
    if (own_shape != want) {
      std::ostringstream os;
      os << "holds a shard of shape " << own_shape << " but " << nd_sbp << " on " << placement
         << " of the logical shape " << *given_shape << " gives it " << want;
      problem = os.str();
    }
  }
  const DType dtype = local.defined() ? local.dtype() : DType::kFloat32;
  std::string layout = placement.ToString() + " " + nd_sbp.ToString() + " " +
                       (local.defined() ? std::string(DTypeName(dtype)) : std::string("(no tensor)"));
  if (given_shape != nullptr) layout += " of logical shape " + given_shape->ToString();
  if (!exchange) {
    TESSEL_CHECK(problem.empty()) << "FromLocal on rank " << rank << ": rank " << rank << " " << problem;
    const Shape logical = given_shape != nullptr ? *given_shape : own_shape;
    if (!member) local = Tensor::Empty(LocalBox(logical, placement, nd_sbp, rank).shape(), dtype);
    return MakeGlobal(local, logical, placement, nd_sbp);
  }
  std::vector<RankMeta> metas =
      ExchangeMeta({layout, member && local.defined() ? own_shape.dims() : std::vector<int64_t>{}, problem});
  std::string bad;
  for (size_t r = 0; r < metas.size(); ++r)
    if (!metas[r].problem.empty())
      bad += (bad.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " " + metas[r].problem);
  TESSEL_CHECK(bad.empty()) << "FromLocal: " << bad;
  // Everyone compares against the first member with a tensor, so every rank
  // names the same culprits; ranks outside the placement may pass none.
  const RankMeta& ref = metas[placement.ranks()[0]];
  std::string odd;
  for (size_t r = 0; r < metas.size(); ++r) {
    const bool outsider_without_tensor =
        !placement.Contains(static_cast<int>(r)) && metas[r].layout.find("(no tensor)") != std::string::npos;
    if (metas[r].layout != ref.layout && !outsider_without_tensor)
      odd += (odd.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " passed " + metas[r].layout);
  }
  TESSEL_CHECK(odd.empty()) << "inconsistent global tensor metadata: " << odd << " but rank "
                            << placement.ranks()[0] << " passed " << ref.layout
                            << "; every rank must give the same placement, NdSbp and dtype";
  const int64_t nd = static_cast<int64_t>(ref.local_shape.size());
  std::vector<std::vector<int64_t>> shards;
  for (int i = 0; i < placement.size(); ++i) {
    shards.push_back(metas[placement.ranks()[i]].local_shape);
    TESSEL_CHECK(static_cast<int64_t>(shards.back().size()) == nd)
        << "inconsistent global tensor metadata: rank " << placement.ranks()[i] << " passed a shard of rank "
        << shards.back().size() << " but rank " << placement.ranks()[0] << " one of rank " << nd;
  }
  Shape logical_shape;
  if (given_shape != nullptr) {
    logical_shape = *given_shape;
  } else {
    // Unsplit dimensions: the size most members agree on.
    std::vector<int64_t> logical(nd);
    for (int64_t d = 0; d < nd; ++d) {
      std::map<int64_t, int> votes;
      for (const auto& sh : shards) ++votes[sh[d]];
      logical[d] = std::max_element(votes.begin(), votes.end(), [](auto& a, auto& b) {
                     return a.second < b.second;
                   })->first;
    }
    for (int64_t d = 0; d < nd; ++d)
      if (nd_sbp.has_split(static_cast<int>(d)))
        logical[d] = InferSplitDim(d, shards, placement, nd_sbp, logical);
    logical_shape = Shape(logical);
  }
  std::string wrong;
  for (int i = 0; i < placement.size(); ++i) {
    Shape want = SliceOf(logical_shape, nd_sbp, placement.hierarchy(), placement.Coord(i)).shape();
    if (Shape(shards[i]) != want) {
      std::ostringstream os;
      os << (wrong.empty() ? "" : "; ") << "rank " << placement.ranks()[i] << " holds a shard of shape "
         << Shape(shards[i]) << " where " << want << " was expected";
      wrong += os.str();
    }
  }
  TESSEL_CHECK(wrong.empty()) << "inconsistent global tensor metadata: " << wrong << " (" << nd_sbp << " on "
                              << placement << " of the logical shape " << logical_shape
                              << ", which the other shards agree on)";
  if (!member && given_shape == nullptr && local.defined() && own_shape != logical_shape) {
    // Right now (the shape came from the members), but worth saying once:
    // the exchange is a world collective each call, which the shape avoids.
    LOG_FIRST_N(WARNING, 1) << "FromLocal on rank " << rank << ": rank " << rank << " is outside "
                            << placement << " and passed a tensor of shape " << own_shape
                            << "; it takes the logical shape " << logical_shape
                            << " from the members. Pass the logical shape as FromLocal's fourth argument "
                            << "(FromLocal(local, placement, nd_sbp, logical_shape)) to skip the exchange of "
                            << "every rank's metadata";
  }
  if (!member) local = Tensor::Empty(LocalBox(logical_shape, placement, nd_sbp, rank).shape(), dtype);
  return MakeGlobal(local, logical_shape, placement, nd_sbp);
}
}  // namespace

Tensor FromLocalShard(const Tensor& local, const Placement& placement, const NdSbp& nd_sbp,
                      const Shape& logical_shape) {
  return FromLocalImpl(local, placement, nd_sbp, &logical_shape);
}

Tensor FromLocal(const Tensor& local, const Placement& placement, const NdSbp& nd_sbp) {
  EnsureLayoutOps();
  return ApplyOp("from_local", {local}, LayoutAttrs(placement, nd_sbp, nullptr)).at(0);
}

Tensor FromLocal(const Tensor& local, const Placement& placement, const NdSbp& nd_sbp,
                 const Shape& logical_shape) {
  EnsureLayoutOps();
  return ApplyOp("from_local", {local},
                 LayoutAttrs(placement, nd_sbp, nullptr).Set("shape", logical_shape.dims()))
      .at(0);
}

void CheckLockstep(const std::string& what, const std::string& request) {
  if (!LockstepChecksEnabled()) return;
  comm::Communicator& world = comm::World();
  const uint64_t mine = Fingerprint(request);
  std::vector<uint64_t> all(world.size());
  world.AllGather(&mine, 1, all.data(), DType::kInt64);
  if (std::all_of(all.begin(), all.end(), [&](uint64_t h) { return h == all[0]; })) return;
  // Someone differs: every rank learns the same from the same exchange.
  std::vector<std::string> requests = AllGatherText(request);
  std::map<std::string, std::vector<int>> by_request;
  for (size_t r = 0; r < requests.size(); ++r) by_request[requests[r]].push_back(static_cast<int>(r));
  std::ostringstream os;
  os << what
     << ": ranks disagree on what they ask for (a lockstep mistake: every rank must make the same call)";
  for (const auto& [text, ranks] : by_request)
    os << "; " << (ranks.size() > 1 ? "ranks " : "rank ") << comm::FormatRanks(ranks) << " asked for "
       << text;
  TESSEL_THROW(StatusCode::kInvalidArgument) << os.str();
}

Tensor GatherLogical(const Tensor& global) {
  TESSEL_CHECK(global.is_global()) << "GatherLogical needs a global tensor, got " << global.ToString();
  const Placement& placement = global.placement();
  Tensor all = global.to_global(placement, NdSbp(std::vector<Sbp>(placement.ndim(), B())));
  return placement.Contains(CurrentRank()) ? all.to_local() : Tensor();
}

}  // namespace tessel
