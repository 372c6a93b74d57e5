#include "layers/common.h"

#include "layers/dist.h"

namespace tessel::layers {

Tensor ToHidden(const Tensor& x, const Placement& placement) {
  if (!x.is_global()) {
    // A local tensor is the whole (replicated) value on every rank.
    return x.to_global(placement, dist::GetNdSbp({B(), B()})).to_global(placement, dist::GetHiddenSbp());
  }
  return x.to_global(placement, dist::GetHiddenSbp());
}

}  // namespace tessel::layers
