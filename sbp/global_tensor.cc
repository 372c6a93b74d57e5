#include "sbp/global_tensor.h"

#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/philox.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

const Placement& Tensor::placement() const {
  TESSEL_CHECK(is_global()) << "placement() of a local tensor " << ToString()
                            << "; only global tensors have one";
  return global_meta()->placement;
}

const NdSbp& Tensor::nd_sbp() const {
  TESSEL_CHECK(is_global()) << "nd_sbp() of a local tensor " << ToString()
                            << "; only global tensors have one";
  return global_meta()->nd_sbp;
}

namespace {
// The planned world of this thread's MetaWorldScope; size 0: none.
thread_local int g_meta_world_size = 0;
thread_local int g_meta_rank = 0;
}  // namespace

MetaWorldScope::MetaWorldScope(int world_size, int rank) {
  TESSEL_CHECK(g_meta_world_size == 0) << "a MetaWorldScope is already alive on this thread";
  TESSEL_CHECK(world_size >= 1 && rank >= 0 && rank < world_size)
      << "planning rank " << rank << " of a world of " << world_size << "; expected 0 <= rank < world size";
  g_meta_world_size = world_size;
  g_meta_rank = rank;
}
MetaWorldScope::~MetaWorldScope() { g_meta_world_size = 0; }
bool InMetaWorld() { return g_meta_world_size > 0; }

int CurrentRank() {
  if (g_meta_world_size > 0) return g_meta_rank;
  return comm::IsWorldInitialized() ? comm::GetDistEnv().rank : 0;
}
int CurrentWorldSize() {
  if (g_meta_world_size > 0) return g_meta_world_size;
  return comm::IsWorldInitialized() ? comm::GetDistEnv().world_size : 1;
}

Placement WorldPlacement(DeviceType type) {
  std::vector<int> ranks(static_cast<size_t>(CurrentWorldSize()));
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int>(r);
  return Placement(type, ranks);
}

Box LocalBox(const Shape& logical, const Placement& placement, const NdSbp& nd_sbp, int rank) {
  int index = placement.IndexOf(rank);
  if (index < 0) return Box(std::vector<Range>(logical.ndim(), Range{0, 0}));
  return SliceOf(logical, nd_sbp, placement.hierarchy(), placement.Coord(index));
}

void CheckGlobalLayout(const Shape& logical, const Placement& placement, const NdSbp& nd_sbp) {
  placement.CheckInWorld(CurrentWorldSize());
  nd_sbp.Check(logical.ndim(), placement.ndim());
  // Throws, saying why, when this process has no device of the type.
  if (placement.device_type() != DeviceType::kCPU && !InMetaWorld()) RankDevice(placement.device_type());
}

Tensor MakeGlobal(const Tensor& local, const Shape& logical, const Placement& placement,
                  const NdSbp& nd_sbp) {
  CheckGlobalLayout(logical, placement, nd_sbp);
  Shape want = LocalBox(logical, placement, nd_sbp, CurrentRank()).shape();
  TESSEL_CHECK(local.to_local().shape() == want)
      << "local shard of shape " << local.to_local().shape() << " on rank " << CurrentRank()
      << " does not fit " << nd_sbp << " on " << placement << " for logical shape " << logical
      << "; expected " << want;
  // A member's shard lives on its device of the placement's type (a shard
  // made on the host, from data or by boxing through the host, moves there).
  Tensor shard = local;
  if (placement.Contains(CurrentRank()) && !local.is_lazy()) {
    const Device device = RankDevice(placement.device_type());
    if (local.device() != device) shard = local.to_local().To(device);
  }
  return Tensor::WrapGlobal(shard, logical, std::make_shared<GlobalMeta>(placement, nd_sbp));
}

Tensor WrapShard(const Tensor& local, const Shape& logical, const std::shared_ptr<const GlobalMeta>& meta,
                 const Shape& shard, bool member) {
  const Tensor own = local.is_global() ? local.to_local() : local;
  TESSEL_CHECK_CODE(own.shape() == shard, StatusCode::kInternal)
      << "local shard of shape " << own.shape() << " on rank " << CurrentRank() << " for " << meta->nd_sbp
      << " on " << meta->placement << " of logical shape " << logical << "; the plan expected " << shard;
  if (member) {
    const Device device = RankDevice(meta->placement.device_type());
    if (own.device() != device) return Tensor::WrapGlobal(own.To(device), logical, meta);
  }
  return Tensor::WrapGlobal(own, logical, meta);
}

Tensor MakeLazyGlobal(const Shape& logical, DType dtype, const Placement& placement, const NdSbp& nd_sbp,
                      std::shared_ptr<const LazyValue> value) {
  CheckGlobalLayout(logical, placement, nd_sbp);
  return Tensor(std::make_shared<LazyTensorImpl>(logical, dtype, Device(placement.device_type(), 0),
                                                 std::make_shared<GlobalMeta>(placement, nd_sbp),
                                                 std::move(value)));
}

Tensor MakeMetaGlobal(const Shape& logical, DType dtype, const Placement& placement, const NdSbp& nd_sbp) {
  return MakeLazyGlobal(logical, dtype, placement, nd_sbp, std::make_shared<const LazyValue>(nullptr, -1));
}

namespace {

// True if this rank holds the value (rather than zeros) under P(sum): it
// sits at index 0 of every partial-sum mesh axis.
bool HoldsPartialValue(const Placement& placement, const NdSbp& nd_sbp, int rank) {
  int index = placement.IndexOf(rank);
  if (index < 0) return false;
  std::vector<int64_t> coord = placement.Coord(index);
  for (int a = 0; a < nd_sbp.size(); ++a)
    if (nd_sbp[a].type() == SbpType::kPartialSum && coord[a] != 0) return false;
  return true;
}

// Builds this rank's shard with element value fn(logical flat index).
template <typename Fn>
Tensor MakeShard(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp, DType dtype, Fn fn) {
  if (InMetaWorld()) return MakeMetaGlobal(shape, dtype, placement, nd_sbp);
  CheckGlobalLayout(shape, placement, nd_sbp);
  const int rank = CurrentRank();
  Box box = LocalBox(shape, placement, nd_sbp, rank);
  const bool zero = !HoldsPartialValue(placement, nd_sbp, rank);
  Tensor local = Tensor::Empty(box.shape(), dtype);
  const std::vector<int64_t> strides = shape.ContiguousStrides();
  const int64_t n = box.numel(), nd = shape.ndim();
  VisitDType(dtype, [&](auto z) {
    using T = decltype(z);
    T* out = static_cast<T*>(local.raw_data());
    std::vector<int64_t> idx(nd, 0);  // position inside the box
    for (int64_t i = 0; i < n; ++i) {
      int64_t flat = 0;
      for (int64_t d = 0; d < nd; ++d) flat += (box[d].begin + idx[d]) * strides[d];
      double v = zero ? 0.0 : fn(flat);
      if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
        out[i] = T(static_cast<float>(v));
      } else {
        out[i] = static_cast<T>(v);
      }
      for (int64_t d = nd - 1; d >= 0; --d) {
        if (++idx[d] < box[d].size()) break;
        idx[d] = 0;
      }
    }
  });
  return MakeGlobal(local, shape, placement, nd_sbp);
}

}  // namespace

Tensor full(const Shape& shape, double value, const Placement& placement, const NdSbp& nd_sbp, DType dtype) {
  return MakeShard(shape, placement, nd_sbp, dtype, [value](int64_t) { return value; });
}
Tensor ReplicatedScalar(double value, const Tensor& like, DType dtype) {
  const Shape scalar(std::vector<int64_t>{});
  if (like.is_global()) {
    return full(scalar, value, like.placement(), NdSbp(std::vector<Sbp>(like.placement().ndim(), B())),
                dtype);
  }
  TESSEL_CHECK(dtype == DType::kFloat32 || dtype == DType::kInt64)
      << "ReplicatedScalar makes f32 or i64 scalars, not " << dtype;
  return dtype == DType::kInt64 ? Tensor::FromVector<int64_t>({static_cast<int64_t>(value)}, scalar)
                                : Tensor::FromVector<float>({static_cast<float>(value)}, scalar);
}
Tensor ReplicatedInt64(int64_t value, const Tensor& like) {
  Tensor out = ReplicatedScalar(0, like, DType::kInt64);
  if (!like.is_global()) out = out.To(like.device());
  WriteInt64(out, value);
  return out;
}
void WriteInt64(const Tensor& scalar, int64_t value) {
  if (scalar.is_global() && !scalar.placement().Contains(CurrentRank())) return;
  if (InMetaWorld() && scalar.is_lazy()) return;  // a planned job's tensor: metadata, nothing to write
  Tensor local = scalar.is_global() ? scalar.to_local() : scalar;
  local.CopyFrom(Tensor::FromVector<int64_t>({value}, local.shape()));
}
Tensor zeros(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp, DType dtype) {
  return full(shape, 0.0, placement, nd_sbp, dtype);
}
Tensor ones(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp, DType dtype) {
  return full(shape, 1.0, placement, nd_sbp, dtype);
}
Tensor arange(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp, DType dtype) {
  return MakeShard(shape, placement, nd_sbp, dtype, [](int64_t i) { return static_cast<double>(i); });
}
Tensor rand(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp, uint64_t seed, DType dtype) {
  TESSEL_CHECK(IsFloating(dtype)) << "rand needs a floating dtype, got " << dtype;
  Philox gen(seed);
  return MakeShard(shape, placement, nd_sbp, dtype,
                   [&gen](int64_t i) { return gen.Uniform(static_cast<uint64_t>(i)); });
}
Tensor randn(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp, uint64_t seed,
             DType dtype) {
  TESSEL_CHECK(IsFloating(dtype)) << "randn needs a floating dtype, got " << dtype;
  Philox gen(seed);
  return MakeShard(shape, placement, nd_sbp, dtype,
                   [&gen](int64_t i) { return gen.Normal(static_cast<uint64_t>(i)); });
}

}  // namespace tessel
