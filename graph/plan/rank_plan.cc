#include "graph/plan/rank_plan.h"

#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "graph/passes/memory_planning.h"
#include "graph/passes/passes.h"
#include "graph/plan/rank_plan.pb.h"
#include "sbp/boxing_plan.h"
#include "sbp/global_tensor.h"
#include "sbp/slice_transfer.h"

namespace tessel {
namespace {

// One communication step: `ranks` is the group of a collective or the
// peer of a send / receive (mesh_axis -1).
void AddComm(proto::PlanOpProto* op, const char* kind, int axis, const std::vector<int>& ranks,
             int64_t elements, DType dtype) {
  proto::CommProto* c = op->add_comms();
  c->set_kind(kind);
  c->set_mesh_axis(axis);
  for (int r : ranks) c->add_ranks(r);
  c->set_elements(elements);
  c->set_dtype(std::string(DTypeName(dtype)));
  c->set_bytes(elements * static_cast<int64_t>(ElementSize(dtype)));
}

// A collective along `axis` of `placement`, on `rank`'s group.
void AddCollective(proto::PlanOpProto* op, const char* kind, const Placement& placement, int axis, int rank,
                   int64_t elements, DType dtype) {
  AddComm(op, kind, axis, placement.GroupAlong(placement.IndexOf(rank), axis), elements, dtype);
}

void AddTransfers(proto::PlanOpProto* op, const std::map<int, int64_t>& sends,
                  const std::map<int, int64_t>& recvs, DType dtype) {
  for (const auto& [peer, n] : sends) AddComm(op, "send", -1, {peer}, n, dtype);
  for (const auto& [peer, n] : recvs) AddComm(op, "recv", -1, {peer}, n, dtype);
}

// Sends and receives of `rank`, merged per peer, moving `in` to `nd_sbp`
// on `placement` in slices (sbp/slice_transfer.h).
void CountSliceTransfers(const Placement& from_placement, const NdSbp& from, const Placement& to_placement,
                         const NdSbp& to, const Shape& shape, int rank, std::map<int, int64_t>* sends,
                         std::map<int, int64_t>* recvs) {
  for (const SliceTransfer& t : PlanSliceTransfers(from_placement, from, to_placement, to, shape)) {
    if (t.src_rank == t.dst_rank) continue;
    if (t.src_rank == rank) (*sends)[t.dst_rank] += t.box.numel();
    if (t.dst_rank == rank) (*recvs)[t.src_rank] += t.box.numel();
  }
}

// A stage boundary's half on `rank`: the send side's sends or the recv
// side's receives.
void AddStageTransfer(proto::PlanOpProto* op, const ir::Value& in, const Placement& placement,
                      const NdSbp& nd_sbp, int rank, bool is_send) {
  std::map<int, int64_t> sends, recvs;
  CountSliceTransfers(in.placement, in.nd_sbp, placement, nd_sbp, in.shape, rank, &sends, &recvs);
  (is_send ? recvs : sends).clear();
  AddTransfers(op, sends, recvs, in.dtype);
}

// What `rank` communicates to lay `in` out by `plan` (the one its
// executable plan runs): the boxing planner's steps, each as this rank sees
// it.
void AddLayoutChange(proto::PlanOpProto* op, const ir::Value& in, const BoxingPlan& plan, int rank) {
  for (const BoxingStep& step : plan.steps) {
    if (step.op == BoxingOp::kSliceTransfer) {
      std::map<int, int64_t> sends, recvs;
      CountSliceTransfers(step.from_placement, step.from, step.to_placement, step.to, in.shape, rank, &sends,
                          &recvs);
      AddTransfers(op, sends, recvs, in.dtype);
      continue;
    }
    if (!step.from_placement.Contains(rank)) continue;
    const bool collective = step.op == BoxingOp::kAllReduce || step.op == BoxingOp::kReduceScatter ||
                            step.op == BoxingOp::kAllGather || step.op == BoxingOp::kAllToAll;
    if (!collective) continue;  // local steps: slicing, zero-filling, renaming
    // The buffer the collective works on: the larger side (a gather's
    // result, a scatter's input, an all-reduce's either).
    const int64_t before = LocalBox(in.shape, step.from_placement, step.from, rank).numel();
    const int64_t after = LocalBox(in.shape, step.to_placement, step.to, rank).numel();
    AddCollective(op, BoxingOpName(step.op), step.from_placement, step.mesh_axis, rank,
                  std::max(before, after), in.dtype);
  }
}

}  // namespace

void CompileRankPlan(const ir::Graph& graph, int rank, proto::RankPlanProto* plan,
                     std::string* instructions) {
  // The ops the rank takes part in, lowered as the runtime lowers them: the
  // communication listed is that of the executable plan's instructions.
  const std::vector<char> member_ops = passes::OpsTakingPart(graph, rank);
  const plan::ExecPlan exec = plan::ExecPlan::Lower(graph, rank, &member_ops);
  CompileRankPlan(exec, plan);
  if (instructions != nullptr) *instructions = exec.ToText();
}

void CompileRankPlan(const plan::ExecPlan& exec, proto::RankPlanProto* plan) {
  const ir::Graph& graph = exec.graph();
  const int rank = exec.rank();
  plan->Clear();
  plan->set_graph(graph.name());
  plan->set_rank(rank);
  std::set<int> values;
  for (const ir::Op& op : graph.ops()) {
    const plan::Instruction& ins = exec.at(op.id);
    if (!ins.runs) continue;
    proto::PlanOpProto* p = plan->add_ops();
    p->set_op(op.id);
    p->set_name(op.name);
    p->set_runs(exec.runs().RunsOf(op.id));
    if (op.micro_batch >= 0 && !exec.runs().unit(op.id)) p->set_micro_batch(op.micro_batch);
    if (op.layer >= 0) p->set_layer(op.layer);
    if (op.stage >= 0) p->set_stage(op.stage);
    p->set_backward(op.backward);
    for (const auto& [k, a] : op.attrs.values()) p->add_attrs(k + "=" + ir::AttrString(a));
    for (int id : op.inputs) p->add_inputs(id), values.insert(id);
    for (int id : op.outputs) p->add_outputs(id), values.insert(id);
    if (ins.kind == plan::Instruction::Kind::kBoxing) {
      if (ins.boxing != nullptr) AddLayoutChange(p, graph.value(op.inputs[0]), *ins.boxing, rank);
    } else if (ins.kind == plan::Instruction::Kind::kSend) {
      AddStageTransfer(p, graph.value(op.inputs[0]), ins.peer_placement, ins.peer_sbp, rank,
                       /*is_send=*/true);
    } else if (ins.kind == plan::Instruction::Kind::kRecv) {
      const ir::Value& out = graph.value(op.outputs[0]);
      AddStageTransfer(p, graph.value(op.inputs[0]), out.placement, out.nd_sbp, rank, /*is_send=*/false);
    } else if (op.kind == ir::OpKind::kGradientBucket) {
      const ir::Value& first = graph.value(op.inputs.at(0));
      int64_t elements = 0;
      for (int id : op.inputs) {
        const ir::Value& v = graph.value(id);
        elements += LocalBox(v.shape, v.placement, v.nd_sbp, rank).numel();
      }
      AddCollective(p, BoxingOpName(BoxingOp::kAllReduce), first.placement,
                    static_cast<int>(op.attrs.Get<int64_t>("mesh_axis")), rank, elements, first.dtype);
    }
  }
  for (int id : values) {
    const ir::Value& v = graph.value(id);
    proto::PlanValueProto* p = plan->add_values();
    p->set_id(id);
    p->set_spec(v.SpecString());
    if (!v.is_global()) {
      for (int64_t d : v.shape.dims()) p->add_local_shape(d);
    } else if (v.placement.Contains(rank)) {
      const Shape local = LocalBox(v.shape, v.placement, v.nd_sbp, rank).shape();  // by value
      for (int64_t d : local.dims()) p->add_local_shape(d);
    }
  }
  std::map<std::string, std::pair<int64_t, int64_t>> summary;  // kind -> (count, bytes)
  for (const proto::PlanOpProto& op : plan->ops()) {
    for (const proto::CommProto& c : op.comms()) {
      auto& [count, bytes] = summary[c.kind()];
      count += op.runs();
      bytes += c.bytes() * op.runs();
    }
  }
  for (const auto& [kind, cb] : summary) {
    proto::CommSummaryProto* s = plan->add_comm_summary();
    s->set_kind(kind);
    s->set_count(cb.first);
    s->set_bytes(cb.second);
  }
  // (The plan's ops in program order: what an in-order run makes of them.)
  const passes::MemoryPlan memory =
      passes::PlanMemory(graph, rank, {.order = exec.program_order(), .runs = &exec.runs()});
  proto::MemoryProto* m = plan->mutable_memory();
  m->set_variable_bytes(memory.variable_bytes);
  m->set_input_bytes(memory.input_bytes);
  m->set_peak_bytes(memory.peak_bytes);
  m->set_peak_op(memory.peak_op);
  m->set_peak_op_name(memory.peak_op_name);
  m->set_total_bytes(memory.total_bytes);
  m->set_peak_activation_bytes(memory.peak_activation_bytes);
}

std::string RankPlanText(const proto::RankPlanProto& plan) {
  std::ostringstream os;
  os << "plan of graph '" << plan.graph() << "' for rank " << plan.rank() << ": " << plan.ops_size()
     << " ops\n";
  for (const proto::PlanOpProto& op : plan.ops()) {
    os << "  " << op.op() << ": " << op.name();
    if (op.has_layer()) os << " [layer " << op.layer() << "]";
    if (op.has_stage()) os << " [stage " << op.stage() << "]";
    if (op.has_micro_batch()) os << " [micro-batch " << op.micro_batch() << "]";
    if (op.runs() > 1) os << " [each of " << op.runs() << " micro-batches]";
    for (const proto::CommProto& c : op.comms()) {
      os << "  [" << c.kind() << " " << c.elements() << " " << c.dtype();
      if (c.kind() == "send" || c.kind() == "recv") {
        os << (c.kind() == "send" ? " to " : " from ") << c.ranks(0);
      } else {
        os << " on {";
        for (int i = 0; i < c.ranks_size(); ++i) os << (i ? ", " : "") << c.ranks(i);
        os << "}";
      }
      os << "]";
    }
    os << "\n";
  }
  os << "communication per step:\n";
  for (const proto::CommSummaryProto& s : plan.comm_summary())
    os << "  " << s.kind() << ": " << s.count() << " ops, " << s.bytes() << " bytes\n";
  passes::MemoryPlan memory;
  memory.variable_bytes = plan.memory().variable_bytes();
  memory.input_bytes = plan.memory().input_bytes();
  memory.peak_bytes = plan.memory().peak_bytes();
  memory.peak_op = plan.memory().peak_op();
  memory.peak_op_name = plan.memory().peak_op_name();
  memory.total_bytes = plan.memory().total_bytes();
  memory.peak_activation_bytes = plan.memory().peak_activation_bytes();
  os << "memory: " << passes::MemoryPlanText(memory) << "\n";
  return os.str();
}

}  // namespace tessel
