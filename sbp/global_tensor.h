// Global tensors: one logical tensor laid out over a placement by an NdSbp.
// A global tensor is a tessel::Tensor whose local data is this process's
// shard; shape() is the logical shape. Ranks outside the placement hold an
// empty shard but keep the metadata (lockstep SPMD).
//
// Factories here need no communication: every rank computes its own shard
// from the logical element indices, so the logical value does not depend on
// the placement or the NdSbp (same seed -> same logical tensor).
#pragma once

#include <memory>

#include "core/tensor.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"
#include "sbp/slice.h"

namespace tessel {

class GlobalMeta {
 public:
  GlobalMeta(Placement placement, NdSbp nd_sbp)
      : placement(std::move(placement)), nd_sbp(std::move(nd_sbp)) {}
  const Placement placement;
  const NdSbp nd_sbp;
};

// This process's world rank and the world size (0 and 1 before Init), or
// the planned ones inside a MetaWorldScope.
int CurrentRank();
int CurrentWorldSize();
// Every rank of the (current) world as a 1-D placement of `type`.
Placement WorldPlacement(DeviceType type);

// Planning for a world this process is not (tessel-plan compiles rank r's
// plan of a 1,024-rank job on one machine). While a scope is alive on this
// thread, CurrentWorldSize() and CurrentRank() are `world_size` and `rank`,
// and the global tensors the factories below make (zeros, randn, ...) are
// metadata only: lazy, with no storage, each with an identity of its own
// (LazyValue without a graph) that a trace turns into a variable. Nothing
// can run on them; graph/ir/meta.h adds the interpreter that gives ops'
// results on them. Scopes do not nest.
class MetaWorldScope {
 public:
  MetaWorldScope(int world_size, int rank);
  ~MetaWorldScope();
  MetaWorldScope(const MetaWorldScope&) = delete;
  MetaWorldScope& operator=(const MetaWorldScope&) = delete;
};
bool InMetaWorld();
// A metadata-only global tensor with an identity of its own (what the
// factories make inside a MetaWorldScope).
Tensor MakeMetaGlobal(const Shape& logical, DType dtype, const Placement& placement, const NdSbp& nd_sbp);

// The logical box `rank` holds (empty if it is outside the placement).
Box LocalBox(const Shape& logical, const Placement& placement, const NdSbp& nd_sbp, int rank);

// Checks placement and NdSbp against the world and the tensor (naming what
// is wrong) and wraps `local`, which must have this rank's shard shape.
Tensor MakeGlobal(const Tensor& local, const Shape& logical, const Placement& placement, const NdSbp& nd_sbp);
// MakeGlobal for a layout checked once (an executable plan's, per value):
// `meta` holds a placement and NdSbp CheckGlobalLayout accepted for
// `logical`, `shard` is this rank's box's shape and `member` whether this
// rank is in the placement. Only the shard's shape is checked (kInternal);
// a member's shard moves to its device as MakeGlobal moves it.
Tensor WrapShard(const Tensor& local, const Shape& logical, const std::shared_ptr<const GlobalMeta>& meta,
                 const Shape& shard, bool member);
// A lazy global tensor: logical shape, dtype and layout (checked as
// MakeGlobal checks them) and no data; `value` links it to a trace (null:
// none). Its device is the placement's device type.
Tensor MakeLazyGlobal(const Shape& logical, DType dtype, const Placement& placement, const NdSbp& nd_sbp,
                      std::shared_ptr<const LazyValue> value = nullptr);
// Validates a layout for a tensor of `logical` shape in the current world.
void CheckGlobalLayout(const Shape& logical, const Placement& placement, const NdSbp& nd_sbp);

// Global factories. Under P (sum) the first rank along the partial axes
// holds the value and the others zeros; under P(max) every rank holds it.
Tensor zeros(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp,
             DType dtype = DType::kFloat32);
Tensor ones(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp,
            DType dtype = DType::kFloat32);
Tensor full(const Shape& shape, double value, const Placement& placement, const NdSbp& nd_sbp,
            DType dtype = DType::kFloat32);
// A 0-d tensor holding `value` (f32 or i64), replicated on `like`'s
// placement, or local if `like` is: an optimizer's step count or learning
// rate beside its parameter.
Tensor ReplicatedScalar(double value, const Tensor& like, DType dtype);
// An i64 0-d tensor holding exactly `value` (past 2^53 too), replicated on
// `like`'s placement, or on `like`'s device if it is local: a random
// stream's position beside the tensor it draws for.
Tensor ReplicatedInt64(int64_t value, const Tensor& like);
// Writes `value` into an i64 0-d tensor's data on this rank (a global one's
// ranks outside its placement hold none), on its device.
void WriteInt64(const Tensor& scalar, int64_t value);
// Element i (row-major logical index) is i.
Tensor arange(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp,
              DType dtype = DType::kFloat32);
// Element i is Philox(seed) uniform / normal at logical index i.
Tensor rand(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp, uint64_t seed = 0,
            DType dtype = DType::kFloat32);
Tensor randn(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp, uint64_t seed = 0,
             DType dtype = DType::kFloat32);

}  // namespace tessel
