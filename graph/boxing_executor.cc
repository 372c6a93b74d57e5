#include "graph/boxing_executor.h"

#include <glog/logging.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "core/bounded_cache.h"
#include "core/box_copy.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/init.h"
#include "graph/global_tensor_ops.h"
#include "sbp/global_tensor.h"
#include "sbp/layout_key.h"
#include "sbp/slice_transfer.h"

namespace tessel {

namespace {

// A local buffer holding logical box `box` of the tensor.
struct Shard {
  Tensor data;
  Box box;
};

// This rank's shard of a global tensor, on the host.
Tensor HostShard(const Tensor& input) { return input.to_local().To(Device::CPU()); }

void CopyPart(const Shard& from, const Box& part, void* dst, const Box& dst_box, DType dtype) {
  CopyBox(from.data.raw_data(), from.box.shape().dims(), part.OffsetIn(from.box), dst, dst_box.shape().dims(),
          part.OffsetIn(dst_box), part.shape().dims(), ElementSize(dtype));
}

// Copies `part` of `from` into a new contiguous tensor.
Tensor Extract(const Shard& from, const Box& part, DType dtype) {
  Tensor out = Tensor::Empty(part.shape(), dtype);
  CopyPart(from, part, out.raw_data(), part, dtype);
  return out;
}

// Packs the parts back to back; returns element counts per part.
std::vector<int64_t> Pack(const Shard& from, const std::vector<Box>& parts, std::vector<char>* buffer,
                          DType dtype) {
  const size_t es = ElementSize(dtype);
  std::vector<int64_t> counts;
  size_t total = 0;
  for (const Box& p : parts) total += static_cast<size_t>(p.numel());
  buffer->resize(total * es);
  size_t offset = 0;
  for (const Box& p : parts) {
    if (!p.empty()) CopyPart(from, p, buffer->data() + offset * es, p, dtype);
    counts.push_back(p.numel());
    offset += static_cast<size_t>(p.numel());
  }
  return counts;
}

// Pastes contiguous parts (laid back to back in `buffer`) into `to`.
void Unpack(const char* buffer, const std::vector<Box>& parts, Shard* to, DType dtype) {
  const size_t es = ElementSize(dtype);
  size_t offset = 0;
  for (const Box& p : parts) {
    if (!p.empty()) {
      CopyBox(buffer + offset * es, p.shape().dims(), std::vector<int64_t>(p.ndim(), 0), to->data.raw_data(),
              to->box.shape().dims(), p.OffsetIn(to->box), p.shape().dims(), es);
    }
    offset += static_cast<size_t>(p.numel());
  }
}

Shard ZerosShard(const Box& box, DType dtype) {
  Tensor t = Tensor::Empty(box.shape(), dtype);
  if (t.nbytes() > 0) std::memset(t.raw_data(), 0, t.nbytes());  // all-zero bits are 0 in every dtype
  return {t, box};
}

// One step along a mesh axis, run by the members of the placement.
Shard RunAxisStep(const BoxingStep& step, const Shard& cur, const Shape& shape, DType dtype, int index) {
  const Placement& pl = step.from_placement;
  const int axis = step.mesh_axis;
  std::vector<int64_t> coord = pl.Coord(index);
  const int64_t p = pl.hierarchy()[axis];
  const int me = static_cast<int>(coord[axis]);
  std::vector<Box> before(p), after(p);
  for (int64_t m = 0; m < p; ++m) {
    coord[axis] = m;
    before[m] = SliceOf(shape, step.from, pl.hierarchy(), coord);
    after[m] = SliceOf(shape, step.to, pl.hierarchy(), coord);
  }
  auto group = [&] { return comm::GetGroup(pl.GroupAlong(index, axis)); };
  const comm::ReduceOp reduce = step.reduce_max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;

  switch (step.op) {
    case BoxingOp::kReinterpret:
      return {cur.data, after[me]};
    case BoxingOp::kAllReduce: {
      Shard out{cur.data.Clone(), after[me]};
      group()->AllReduce(out.data.raw_data(), out.box.numel(), dtype, reduce);
      return out;
    }
    case BoxingOp::kReduceScatter: {
      std::vector<char> send;
      std::vector<int64_t> counts = Pack(cur, after, &send, dtype);
      Shard out{Tensor::Empty(after[me].shape(), dtype), after[me]};
      group()->ReduceScatterV(send.data(), out.data.raw_data(), counts, dtype, reduce);
      return out;
    }
    case BoxingOp::kAllGather: {
      std::vector<int64_t> counts;
      for (const Box& b : before) counts.push_back(b.numel());
      std::vector<char> gathered(static_cast<size_t>(after[me].numel()) * ElementSize(dtype));
      group()->AllGatherV(cur.data.raw_data(), gathered.data(), counts, dtype);
      Shard out{Tensor::Empty(after[me].shape(), dtype), after[me]};
      Unpack(gathered.data(), before, &out, dtype);
      return out;
    }
    case BoxingOp::kAllToAll: {
      std::vector<Box> sends, recvs;
      for (int64_t m = 0; m < p; ++m) {
        sends.push_back(before[me].Intersect(after[m]));
        recvs.push_back(before[m].Intersect(after[me]));
      }
      std::vector<char> send;
      std::vector<int64_t> send_counts = Pack(cur, sends, &send, dtype), recv_counts;
      for (const Box& b : recvs) recv_counts.push_back(b.numel());
      std::vector<char> recv(static_cast<size_t>(after[me].numel()) * ElementSize(dtype));
      group()->AllToAllV(send.data(), send_counts, recv.data(), recv_counts, dtype);
      Shard out{Tensor::Empty(after[me].shape(), dtype), after[me]};
      Unpack(recv.data(), recvs, &out, dtype);
      return out;
    }
    case BoxingOp::kLocalSlice:
      return {Extract(cur, after[me], dtype), after[me]};
    case BoxingOp::kZeroFill:
      return me == 0 ? Shard{cur.data, after[me]} : ZerosShard(after[me], dtype);
    case BoxingOp::kZeroPad: {
      Shard out = ZerosShard(after[me], dtype);
      CopyPart(cur, cur.box, out.data.raw_data(), out.box, dtype);
      return out;
    }
    case BoxingOp::kSliceTransfer:
      break;
  }
  TESSEL_THROW(StatusCode::kInternal) << "unexpected boxing step " << step.Describe();
}

// Posts this rank's sends of `transfers` (parts of `cur`, whose buffers
// go to `buffers` until the sends complete). Tags count the boxing messages
// per peer, on both sides in the same (planned) order: unique among
// concurrent transfers on other channels. A given `tag` (a stage
// transfer's own) is used for every message instead.
void PostSends(const std::vector<SliceTransfer>& transfers, const Shard& cur, DType dtype, int rank,
               std::vector<Tensor>* buffers, std::vector<std::unique_ptr<comm::Work>>* pending,
               std::optional<uint32_t> given_tag = std::nullopt) {
  comm::Communicator& world = comm::World();
  for (const SliceTransfer& t : transfers) {
    if (t.src_rank != rank || t.dst_rank == rank) continue;
    buffers->push_back(Extract(cur, t.box, dtype));
    const uint32_t tag = given_tag ? *given_tag
                                   : world.NextTag(comm::Communicator::kBoxingChannel, t.dst_rank,
                                                   comm::Communicator::Direction::kSend);
    pending->push_back(world.ISend(buffers->back().raw_data(), t.box.numel(), dtype, t.dst_rank, tag));
  }
}

// Posts this rank's receives of `transfers` into `parts` (buffer, box).
void PostReceives(const std::vector<SliceTransfer>& transfers, DType dtype, int rank,
                  std::vector<std::pair<Tensor, Box>>* parts,
                  std::vector<std::unique_ptr<comm::Work>>* pending,
                  std::optional<uint32_t> given_tag = std::nullopt) {
  comm::Communicator& world = comm::World();
  for (const SliceTransfer& t : transfers) {
    if (t.dst_rank != rank || t.src_rank == rank) continue;
    parts->emplace_back(Tensor::Empty(t.box.shape(), dtype), t.box);
    const uint32_t tag = given_tag ? *given_tag
                                   : world.NextTag(comm::Communicator::kBoxingChannel, t.src_rank,
                                                   comm::Communicator::Direction::kRecv);
    pending->push_back(world.IRecv(parts->back().first.raw_data(), t.box.numel(), dtype, t.src_rank, tag));
  }
}

// Point-to-point slices between placements (or layouts), over the world.
Shard RunTransfer(const BoxingStep& step, const Shard& cur, const Shape& shape, DType dtype, int rank) {
  Box dst_box = LocalBox(shape, step.to_placement, step.to, rank);
  Shard out{Tensor::Empty(dst_box.shape(), dtype), dst_box};
  std::vector<SliceTransfer> transfers =
      PlanSliceTransfers(step.from_placement, step.from, step.to_placement, step.to, shape);
  for (const SliceTransfer& t : transfers)
    if (t.src_rank == rank && t.dst_rank == rank) CopyPart(cur, t.box, out.data.raw_data(), out.box, dtype);
  std::vector<Tensor> send_buffers;
  std::vector<std::pair<Tensor, Box>> parts;
  std::vector<std::unique_ptr<comm::Work>> pending;
  PostSends(transfers, cur, dtype, rank, &send_buffers, &pending);
  PostReceives(transfers, dtype, rank, &parts, &pending);
  for (auto& w : pending) w->Wait();
  for (auto& [buf, box] : parts) CopyPart(Shard{buf, box}, box, out.data.raw_data(), out.box, dtype);
  return out;
}

}  // namespace

std::string ToGlobalRequest(DType dtype, const Shape& shape, const Placement& from_placement,
                            const NdSbp& from, const Placement& to_placement, const NdSbp& to) {
  std::ostringstream os;
  os << "to_global of " << DTypeName(dtype) << " " << shape << " " << from << " on " << from_placement
     << " -> " << to << " on " << to_placement;
  return os.str();
}

Tensor BoxTo(const Tensor& input, const Placement& placement, const NdSbp& nd_sbp) {
  if (LockstepChecksEnabled())
    CheckLockstep("to_global", ToGlobalRequest(input.dtype(), input.shape(), input.placement(),
                                               input.nd_sbp(), placement, nd_sbp));
  CheckGlobalLayout(input.shape(), placement, nd_sbp);
  if (input.placement() == placement && input.nd_sbp() == nd_sbp) return input.detach();
  VLOG(1) << "to_global boxes " << input.shape() << " " << input.nd_sbp() << " on " << input.placement()
          << " -> " << nd_sbp << " on " << placement;
  return ExecuteBoxing(input, *GetBoxingPlan(input.placement(), input.nd_sbp(), placement, nd_sbp,
                                             input.shape(), input.dtype()));
}

Tensor ExecuteBoxing(const Tensor& input, const BoxingPlan& plan) {
  TESSEL_CHECK(input.is_global() && input.placement() == plan.src_placement && input.nd_sbp() == plan.src &&
               input.shape() == plan.shape && input.dtype() == plan.dtype)
      << "boxing plan for " << plan.src_placement << " " << plan.src << " " << plan.dtype << " " << plan.shape
      << " applied to " << input.ToString();
  const int rank = CurrentRank();
  const DType dtype = plan.dtype;
  // Boxing runs on the host: a device shard is copied out first, and
  // MakeGlobal moves the result onto the destination's device. This is the
  // path for ranks that share a GPU, where NCCL cannot run.
  Shard cur{HostShard(input), LocalBox(plan.shape, plan.src_placement, plan.src, rank)};
  for (const BoxingStep& step : plan.steps) {
    if (step.op == BoxingOp::kSliceTransfer) {
      cur = RunTransfer(step, cur, plan.shape, dtype, rank);
      continue;
    }
    int index = step.from_placement.IndexOf(rank);
    if (index < 0) {
      cur = {Tensor::Empty(LocalBox(plan.shape, step.to_placement, step.to, rank).shape(), dtype),
             LocalBox(plan.shape, step.to_placement, step.to, rank)};
      continue;
    }
    cur = RunAxisStep(step, cur, plan.shape, dtype, index);
  }
  return MakeGlobal(cur.data, plan.shape, plan.dst_placement, plan.dst);
}

PostedSends PostSendSlices(const Tensor& input, const Placement& placement, const NdSbp& nd_sbp,
                           std::optional<uint32_t> tag) {
  const int rank = CurrentRank();
  TESSEL_CHECK(input.is_global() && !input.placement().Overlaps(placement))
      << "SendSlices of " << input.ToString() << " to " << placement
      << ": the two sides of a send must have no rank in common";
  PostedSends posted;
  if (!input.placement().Contains(rank)) return posted;
  const std::vector<SliceTransfer> transfers =
      PlanSliceTransfers(input.placement(), input.nd_sbp(), placement, nd_sbp, input.shape());
  const Shard cur{HostShard(input), LocalBox(input.shape(), input.placement(), input.nd_sbp(), rank)};
  PostSends(transfers, cur, input.dtype(), rank, &posted.slices, &posted.works, tag);
  return posted;
}

void PostedSends::Wait() {
  for (auto& w : works) w->Wait();
  works.clear();
  slices.clear();
}

void SendSlices(const Tensor& input, const Placement& placement, const NdSbp& nd_sbp,
                std::optional<uint32_t> tag) {
  PostSendSlices(input, placement, nd_sbp, tag).Wait();
}

PostedReceive PostReceiveSlices(const Placement& src_placement, const NdSbp& src, const Shape& shape,
                                DType dtype, const Placement& placement, const NdSbp& nd_sbp,
                                std::optional<uint32_t> tag) {
  const int rank = CurrentRank();
  TESSEL_CHECK(!src_placement.Overlaps(placement))
      << "ReceiveSlices from " << src_placement << " to " << placement
      << ": the two sides of a receive must have no rank in common";
  PostedReceive posted;
  posted.box = LocalBox(shape, placement, nd_sbp, rank);
  posted.out = Tensor::Empty(posted.box.shape(), dtype);
  posted.shape = shape;
  posted.dtype = dtype;
  posted.placement = placement;
  posted.nd_sbp = nd_sbp;
  if (placement.Contains(rank))
    PostReceives(PlanSliceTransfers(src_placement, src, placement, nd_sbp, shape), dtype, rank, &posted.parts,
                 &posted.works, tag);
  return posted;
}

Tensor PostedReceive::Wait() {
  for (auto& w : works) w->Wait();
  works.clear();
  for (auto& [buf, part] : parts) CopyPart(Shard{buf, part}, part, out.raw_data(), box, dtype);
  parts.clear();
  return MakeGlobal(out, shape, placement, nd_sbp);
}

Tensor ReceiveSlices(const Placement& src_placement, const NdSbp& src, const Shape& shape, DType dtype,
                     const Placement& placement, const NdSbp& nd_sbp, std::optional<uint32_t> tag) {
  return PostReceiveSlices(src_placement, src, shape, dtype, placement, nd_sbp, tag).Wait();
}

namespace {
BoundedCache<std::string, std::shared_ptr<const BoxingPlan>>& PlanCache() {
  static auto* cache =
      new BoundedCache<std::string, std::shared_ptr<const BoxingPlan>>(kBoxingPlanCacheCapacity);
  return *cache;
}
}  // namespace

std::shared_ptr<const BoxingPlan> GetBoxingPlan(const Placement& src_placement, const NdSbp& src,
                                                const Placement& dst_placement, const NdSbp& dst,
                                                const Shape& shape, DType dtype) {
  std::string key;  // binary (sbp/layout_key.h): placements by interned id
  key.reserve(96);
  AppendKey(&key, src_placement);
  AppendKey(&key, src);
  AppendKey(&key, dst_placement);
  AppendKey(&key, dst);
  AppendKey(&key, shape);
  AppendKey(&key, dtype);
  if (auto hit = PlanCache().Get(key)) return *hit;
  auto plan =
      std::make_shared<const BoxingPlan>(PlanBoxing(src_placement, src, dst_placement, dst, shape, dtype));
  PlanCache().Put(key, plan);
  return plan;
}

size_t BoxingPlanCacheSize() { return PlanCache().size(); }

}  // namespace tessel
