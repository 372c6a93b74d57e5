// Carries out a boxing plan (sbp/boxing_plan.h) with the communicator.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/tensor.h"
#include "sbp/boxing_plan.h"
#include "sbp/slice.h"

namespace tessel {

// `input` must be a global tensor laid out as the plan's source; returns it
// laid out as the plan's destination. Every rank of the world calls it in
// lockstep; ranks outside a step's placement skip that step.
Tensor ExecuteBoxing(const Tensor& input, const BoxingPlan& plan);

// `input` (global) laid out as `nd_sbp` on `placement`, without recording
// autograd: what the to_global op and the eager interpreter's input
// conversions run. Checks the layout fits the shape; with lockstep checks
// on, the ranks first agree on the request (core/init.h). The same layout
// returns the input's data, detached.
Tensor BoxTo(const Tensor& input, const Placement& placement, const NdSbp& nd_sbp);
// The request lockstep checks compare for a conversion (BoxTo's, and an
// executable plan's boxing instruction's).
std::string ToGlobalRequest(DType dtype, const Shape& shape, const Placement& from_placement,
                            const NdSbp& from, const Placement& to_placement, const NdSbp& to);

// The two halves of moving a global tensor to a placement with no rank in
// common with its own (a pipeline's stage boundary), for the send and recv
// ops that run on either side: SendSlices sends this rank's parts of
// `input` to the ranks of `placement` that need them (nothing off
// `input`'s placement); ReceiveSlices returns the tensor laid out as
// `nd_sbp` on `placement`, receiving this rank's parts from the ranks of
// `src_placement` (an empty shard off `placement`). Neither layout may be
// partial; the slices are those BoxTo would move (sbp/slice_transfer.h).
// Without a `tag` the messages take the boxing channel's next tags, so the
// two sides must move their tensors in the same order; with one (a stage
// transfer's own, the same on both sides) they match by it, in any order.
void SendSlices(const Tensor& input, const Placement& placement, const NdSbp& nd_sbp,
                std::optional<uint32_t> tag = std::nullopt);
// SendSlices without the wait: the sends are posted and complete once the
// receivers take them (a send waits for its receive), so a pipeline stage
// goes on computing meanwhile. Wait() finishes them (or throws at the
// communicator's timeout naming the peer); the slices stay alive until then.
struct PostedSends {
  std::vector<Tensor> slices;
  std::vector<std::unique_ptr<comm::Work>> works;
  void Wait();
};
PostedSends PostSendSlices(const Tensor& input, const Placement& placement, const NdSbp& nd_sbp,
                           std::optional<uint32_t> tag = std::nullopt);
Tensor ReceiveSlices(const Placement& src_placement, const NdSbp& src, const Shape& shape, DType dtype,
                     const Placement& placement, const NdSbp& nd_sbp,
                     std::optional<uint32_t> tag = std::nullopt);
// ReceiveSlices without the wait: the receives are posted (their buffers
// handed to the communicator) and Wait() returns the tensor once they have
// arrived (or throws at the communicator's timeout naming the peer). A
// stage posts a receive as soon as its schedule reaches it and goes on with
// other communication while the message is on its way.
struct PostedReceive {
  Tensor out;  // this rank's shard, filled by Wait()
  Box box;
  Shape shape;
  DType dtype = DType::kFloat32;
  Placement placement;
  NdSbp nd_sbp;
  std::vector<std::pair<Tensor, Box>> parts;
  std::vector<std::unique_ptr<comm::Work>> works;
  Tensor Wait();
};
PostedReceive PostReceiveSlices(const Placement& src_placement, const NdSbp& src, const Shape& shape,
                                DType dtype, const Placement& placement, const NdSbp& nd_sbp,
                                std::optional<uint32_t> tag = std::nullopt);

// The plan for a conversion, cached by (layouts, shape, dtype) in a cache of
// at most kBoxingPlanCacheCapacity plans (least recently used evicted).
constexpr size_t kBoxingPlanCacheCapacity = 4096;
std::shared_ptr<const BoxingPlan> GetBoxingPlan(const Placement& src_placement, const NdSbp& src,
                                                const Placement& dst_placement, const NdSbp& dst,
                                                const Shape& shape, DType dtype);
// Plans cached now (for tests and reports).
size_t BoxingPlanCacheSize();

}  // namespace tessel
