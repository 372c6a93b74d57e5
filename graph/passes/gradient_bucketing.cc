// Gradient bucketing: data parallelism leaves every parameter's gradient a
// partial sum over the data-parallel mesh axis, reduced to a broadcast
// before the optimizer reads it — one all-reduce per parameter, each paying
// a collective's latency. Here those reductions become a few all-reduces
// over buckets of many gradients (PyTorch DDP's and OneFlow's bucketing).
// Any reductions along the same axis that do not depend on each other fuse
// the same way (XLA's all-reduce combiner): in a step with few gradients
// the forward's independent ones are as many collectives again.
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
    def.communicates = true;
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
  int first_member = std::numeric_limits<int>::max();
  int64_t bytes = 0;
  int axis = -1;
};

// Whether op `from` depends on one of `bucket`'s members: a walk back over
// predecessors, no further back than the bucket's first member.
class DependenceWalk {
 public:
  explicit DependenceWalk(const std::vector<std::vector<int>>& preds)
      : preds_(preds), seen_(preds.size(), 0), member_(preds.size(), 0) {}

  bool Depends(int from, const Bucket& bucket) {
    if (from < bucket.first_member) return false;
    ++stamp_;
    for (size_t m : bucket.members) member_[m] = stamp_;
    std::vector<int> stack = {from};
    seen_[static_cast<size_t>(from)] = stamp_;
    while (!stack.empty()) {
      const int op = stack.back();
      stack.pop_back();
      if (member_[static_cast<size_t>(op)] == stamp_) return true;
      for (int pred : preds_[static_cast<size_t>(op)]) {
        if (pred < bucket.first_member || seen_[static_cast<size_t>(pred)] == stamp_) continue;
        seen_[static_cast<size_t>(pred)] = stamp_;
        stack.push_back(pred);
      }
    }
    return false;
  }

 private:
  const std::vector<std::vector<int>>& preds_;
  std::vector<uint32_t> seen_, member_;
  uint32_t stamp_ = 0;
};

ir::Op MakeBucketOp(const ir::Graph& graph, const Bucket& b) {
  const std::vector<ir::Op>& ops = graph.ops();
  ir::Op fused;
  fused.name = "all_reduce_bucket";
  fused.attrs = Attrs{{"mesh_axis", static_cast<int64_t>(b.axis)}, {"bytes", b.bytes}};
  fused.micro_batch = ops[b.members[0]].micro_batch;
  fused.layer = ops[b.members[0]].layer;
  fused.stage = ops[b.members[0]].stage;
  for (size_t m : b.members) {
    fused.inputs.push_back(ops[m].inputs[0]);
    fused.outputs.push_back(ops[m].outputs[0]);
    // Reducing what backward produced (the gradients) is part of backward.
    const int producer = graph.value(ops[m].inputs[0]).producer;
    fused.backward |= ops[m].backward || (producer >= 0 && ops[static_cast<size_t>(producer)].backward);
    if (ops[m].layer != fused.layer) fused.layer = -1;  // gradients of several layers
  }
  return fused;
}

}  // namespace

void BucketGradients(ir::Graph& graph, int64_t bucket_bytes) {
  if (bucket_bytes <= 0) return;
  EnsureBucketOp();
  EnsureLayoutOps();  // Predecessors looks up every op's definition
  const std::vector<ir::Op>& ops = graph.ops();

  // Candidates in the order their inputs are produced (backward's order).
  struct Candidate {
    size_t op;
    int producer, axis;
  };
  std::vector<Candidate> candidates;
  for (const ir::Op& op : ops) {
    if (op.kind != ir::OpKind::kToGlobal) continue;
    const ir::Value& in = graph.value(op.inputs[0]);
    const int axis = AllReduceAxis(in, graph.value(op.outputs[0]));
    if (axis >= 0) candidates.push_back({size_t(op.id), in.producer, axis});
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.producer < b.producer; });

  // Greedy: a bucket takes the next reduction of its group and micro-batch
  // while it fits and does not depend on a member's result. Independence is
  // all a bucket needs: the ops are reordered below so it runs once its
  // inputs exist and before its members' readers. So independent
  // reductions outside backward fuse too (a loss's sum and its token count;
  // cross-entropy's sum of exponentials and its target logits). Different
  // micro-batches never share one: that would run their forwards together
  // and keep both micro-batches' activations alive.
  const std::vector<std::vector<int>> preds = ir::Predecessors(graph);
  DependenceWalk walk(preds);
  std::vector<Bucket> buckets;
  std::map<std::tuple<uint64_t, int, DType, int>, size_t> open;  // (placement, axis, dtype, micro-batch)
  for (const Candidate& c : candidates) {
    const ir::Value& in = graph.value(ops[c.op].inputs[0]);
    const int64_t bytes = in.shape.numel() * static_cast<int64_t>(ElementSize(in.dtype));
    const auto key = std::make_tuple(in.placement.id(), c.axis, in.dtype, ops[c.op].micro_batch);
    auto it = open.find(key);
    if (it != open.end()) {
      Bucket& b = buckets[it->second];
      if (b.bytes + bytes > bucket_bytes || (c.producer >= 0 && walk.Depends(c.producer, b)))
        open.erase(it), it = open.end();
    }
    if (it == open.end()) {
      it = open.emplace(key, buckets.size()).first;
      buckets.emplace_back();
    }
    Bucket& b = buckets[it->second];
    b.members.push_back(c.op);
    b.first_member = std::min(b.first_member, static_cast<int>(c.op));
    b.bytes += bytes;
    b.axis = c.axis;
  }

  // Rebuild: a bucket of two or more replaces its members (a bucket of one
  // stays a to_global). The ops are then listed again in dependence order:
  // a bucket right after its last input is produced, every other op as
  // early as the original order allows. Ops that read a member wait for
  // the bucket; the others keep their order.
  std::vector<int> node_of(ops.size(), -1);  // op -> node
  std::vector<ir::Op> nodes;
  std::vector<int64_t> priority;
  for (const Bucket& b : buckets) {
    if (b.members.size() < 2) continue;
    for (size_t m : b.members) node_of[m] = static_cast<int>(nodes.size());
    nodes.push_back(MakeBucketOp(graph, b));
    priority.push_back(-1);  // before any other ready op
  }
  if (nodes.empty()) return;
  for (const ir::Op& op : ops) {
    if (node_of[op.id] >= 0) continue;
    node_of[op.id] = static_cast<int>(nodes.size());
    nodes.push_back(op);
    priority.push_back(op.id);
  }
  std::vector<std::vector<int>> node_preds(nodes.size());
  for (const ir::Op& op : ops) {
    const int to = node_of[op.id];
    for (int pred : preds[op.id]) {
      const int from = node_of[static_cast<size_t>(pred)];
      if (from != to) node_preds[static_cast<size_t>(to)].push_back(from);
    }
  }
  std::vector<ir::Op> out;
  out.reserve(nodes.size());
  for (int n : ir::PriorityTopologicalOrder(node_preds, priority))
    out.push_back(std::move(nodes[static_cast<size_t>(n)]));
  TESSEL_CHECK(out.size() == nodes.size())
      << "gradient bucketing made a cycle: a bucket depends on its own result (" << nodes.size() - out.size()
      << " ops unscheduled)";
  graph.SetOps(std::move(out));
}

}  // namespace tessel::passes
