// Gradient bucketing: data parallelism leaves every parameter's gradient a
// partial sum over the data-parallel mesh axis, reduced to a broadcast
// before the optimizer reads it — one all-reduce per parameter, each paying
// a collective's latency. Here those reductions become a few all-reduces
// over buckets of many gradients (PyTorch DDP's and OneFlow's bucketing).
//
// All-reducing a member along mesh axis `a` runs on the ranks that differ
// only in coordinate `a`; they hold shards of the same logical box (the
// other axes' layouts are the same for them), so packing each rank's
// shards back to back and all-reducing the pack along `a` reduces each
// member exactly as its own all-reduce would.
#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/init.h"
#include "graph/global_tensor_ops.h"
#include "graph/passes/passes.h"
#include "sbp/global_tensor.h"

namespace tessel::passes {
namespace {

// The mesh axis along which `from` -> `to` is a single sum all-reduce
// (partial sum to broadcast there, equal elsewhere), or -1.
int AllReduceAxis(const ir::Value& from, const ir::Value& to) {
  if (from.placement != to.placement || from.nd_sbp.size() != to.nd_sbp.size()) return -1;
  int axis = -1;
  for (int a = 0; a < from.nd_sbp.size(); ++a) {
    if (from.nd_sbp[a] == to.nd_sbp[a]) continue;
    if (axis >= 0 || from.nd_sbp[a] != Sbp::PartialSum() || !to.nd_sbp[a].is_broadcast()) return -1;
    axis = a;
  }
  // Along an axis of size 1 the change is a renaming, not a reduction.
  return axis >= 0 && from.placement.hierarchy()[axis] > 1 ? axis : -1;
}

std::vector<Tensor> RunAllReduceBucket(const std::vector<Tensor>& in, const Attrs& attrs) {
  const int axis = static_cast<int>(attrs.Get<int64_t>("mesh_axis"));
  const Placement& placement = in.at(0).placement();
  const DType dtype = in[0].dtype();
  std::vector<NdSbp> out_sbp;
  std::vector<Tensor> locals;
  int64_t total = 0, logical = 0;
  for (const Tensor& t : in) {
    TESSEL_CHECK(t.is_global() && t.placement() == placement && t.dtype() == dtype &&
                 axis < t.nd_sbp().size() && t.nd_sbp()[axis] == Sbp::PartialSum())
        << "all_reduce_bucket along mesh axis " << axis << " of tensors on " << placement << " got "
        << t.ToString();
    NdSbp to = t.nd_sbp();
    to[axis] = Sbp::Broadcast();
    out_sbp.push_back(to);
    locals.push_back(t.to_local());
    total += locals.back().numel();
    logical += t.shape().numel();
  }
  if (LockstepChecksEnabled()) {
    std::ostringstream os;
    // Logical sizes: shards of uneven splits differ between ranks.
    os << in.size() << " tensors, " << logical << " elements of " << DTypeName(dtype) << " along axis "
       << axis << " on " << placement;
    CheckLockstep("all_reduce_bucket", os.str());
  }
  const int rank = CurrentRank();
  const int index = placement.IndexOf(rank);
  std::vector<Tensor> out;
  if (index < 0) {
    for (size_t i = 0; i < in.size(); ++i) {
      const Shape local = LocalBox(in[i].shape(), placement, out_sbp[i], rank).shape();
      out.push_back(MakeGlobal(Tensor::Empty(local, dtype), in[i].shape(), placement, out_sbp[i]));
    }
    return out;
  }
  Tensor pack = Tensor::Empty(Shape({total}), dtype);
  char* p = static_cast<char*>(pack.raw_data());
  for (const Tensor& local : locals) {
    std::memcpy(p, local.raw_data(), local.nbytes());
    p += local.nbytes();
  }
  comm::GetGroup(placement.GroupAlong(index, axis))
      ->AllReduce(pack.raw_data(), total, dtype, comm::ReduceOp::kSum);
  p = static_cast<char*>(pack.raw_data());
  for (size_t i = 0; i < in.size(); ++i) {
    Tensor local = Tensor::Empty(locals[i].shape(), dtype);
    std::memcpy(local.raw_data(), p, local.nbytes());
    p += local.nbytes();
    out.push_back(MakeGlobal(local, in[i].shape(), placement, out_sbp[i]));
  }
  return out;
}

void EnsureBucketOp() {
  static const bool registered = [] {
    OpDef def;
    def.name = "all_reduce_bucket";
    def.inputs = {"gradients"};
    def.variadic = true;
    def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) { return in; };
    def.run = RunAllReduceBucket;
    def.workspace_bytes = [](const std::vector<TensorSpec>& shards) {  // the packed buffer
      int64_t bytes = 0;
      for (const TensorSpec& s : shards)
        bytes += s.shape.numel() * static_cast<int64_t>(ElementSize(s.dtype));
      return bytes;
    };
    RegisterOp(std::move(def));
    return true;
  }();
  (void)registered;
}

struct Bucket {
  std::vector<size_t> members;  // indices of to_global ops
  int last_producer = -1;       // the latest op among the members' inputs' producers
  int first_reader = std::numeric_limits<int>::max();
  int64_t bytes = 0;
  int axis = -1;
};

}  // namespace

void BucketGradients(ir::Graph& graph, int64_t bucket_bytes) {
  if (bucket_bytes <= 0) return;
  EnsureBucketOp();
  const std::vector<ir::Op>& ops = graph.ops();
  std::vector<int> first_reader(graph.values().size(), std::numeric_limits<int>::max());
  for (const ir::Op& op : ops)
    for (int i : op.inputs) first_reader[i] = std::min(first_reader[i], op.id);
  for (const auto& [name, id] : graph.outputs())
    first_reader[id] = std::min(first_reader[id], int(ops.size()));

  // Candidates in the order their inputs are produced (backward's order).
  struct Candidate {
    size_t op;
    int producer, reader, axis;
  };
  std::vector<Candidate> candidates;
  for (const ir::Op& op : ops) {
    if (op.name != "to_global") continue;
    const ir::Value& in = graph.value(op.inputs[0]);
    const int axis = AllReduceAxis(in, graph.value(op.outputs[0]));
    if (axis >= 0) candidates.push_back({size_t(op.id), in.producer, first_reader[op.outputs[0]], axis});
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.producer < b.producer; });

  // Greedy: a bucket takes the next gradient while it fits and can run
  // after all its members' inputs exist and before any of their readers.
  std::vector<Bucket> buckets;
  std::map<std::tuple<uint64_t, int, DType>, size_t> open;  // (placement id, axis, dtype) -> bucket
  for (const Candidate& c : candidates) {
    const ir::Value& in = graph.value(ops[c.op].inputs[0]);
    const int64_t bytes = in.shape.numel() * static_cast<int64_t>(ElementSize(in.dtype));
    const auto key = std::make_tuple(in.placement.id(), c.axis, in.dtype);
    auto it = open.find(key);
    if (it != open.end()) {
      Bucket& b = buckets[it->second];
      const bool fits = b.bytes + bytes <= bucket_bytes;
      const bool orderable = std::max(b.last_producer, c.producer) < std::min(b.first_reader, c.reader);
      if (!fits || !orderable) open.erase(it), it = open.end();
    }
    if (it == open.end()) {
      it = open.emplace(key, buckets.size()).first;
      buckets.emplace_back();
    }
    Bucket& b = buckets[it->second];
    b.members.push_back(c.op);
    b.last_producer = std::max(b.last_producer, c.producer);
    b.first_reader = std::min(b.first_reader, c.reader);
    b.bytes += bytes;
    b.axis = c.axis;
  }

  // Rebuild: a bucket of two or more runs right after its last producer
  // (at the start when all its inputs are graph inputs or variables); a
  // bucket of one stays a to_global.
  std::vector<int> bucket_of(ops.size(), -1);
  std::multimap<int, size_t> after;  // producer op -> buckets placed after it
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b].members.size() < 2) continue;
    for (size_t m : buckets[b].members) bucket_of[m] = static_cast<int>(b);
    after.emplace(buckets[b].last_producer, b);
  }
  if (after.empty()) return;
  std::vector<ir::Op> out;
  auto emit_buckets_after = [&](int producer) {
    auto [lo, hi] = after.equal_range(producer);
    for (auto it = lo; it != hi; ++it) {
      const Bucket& b = buckets[it->second];
      ir::Op fused;
      fused.name = "all_reduce_bucket";
      fused.attrs = Attrs{{"mesh_axis", static_cast<int64_t>(b.axis)}, {"bytes", b.bytes}};
      for (size_t m : b.members) {
        fused.inputs.push_back(ops[m].inputs[0]);
        fused.outputs.push_back(ops[m].outputs[0]);
        // Reducing what backward produced (the gradients) is part of backward.
        const int producer = graph.value(ops[m].inputs[0]).producer;
        fused.backward |= ops[m].backward || (producer >= 0 && ops[static_cast<size_t>(producer)].backward);
      }
      out.push_back(std::move(fused));
    }
  };
  emit_buckets_after(-1);
  for (const ir::Op& op : ops) {
    if (bucket_of[op.id] < 0) out.push_back(op);
    emit_buckets_after(op.id);
  }
  graph.SetOps(std::move(out));
}

}  // namespace tessel::passes
