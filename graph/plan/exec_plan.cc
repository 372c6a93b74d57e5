#include "graph/plan/exec_plan.h"

#include <sstream>

#include "core/error.h"
#include "core/init.h"
#include "core/join.h"
#include "graph/boxing_executor.h"
#include "graph/global_tensor_ops.h"
#include "graph/kernel_call.h"
#include "graph/op_profile.h"
#include "graph/passes/memory_planning.h"
#include "graph/passes/passes.h"

namespace tessel::plan {
namespace {

const char* KindName(Instruction::Kind kind) {
  switch (kind) {
    case Instruction::Kind::kKernel:
      return "kernel";
    case Instruction::Kind::kNotHere:
      return "not-here";
    case Instruction::Kind::kBoxing:
      return "boxing";
    case Instruction::Kind::kSend:
      return "send";
    case Instruction::Kind::kRecv:
      return "recv";
    case Instruction::Kind::kFromLocal:
      return "from-local";
    case Instruction::Kind::kSelfRun:
      return "self-run";
    case Instruction::Kind::kSum:
      return "sum";
  }
  return "?";
}

// The stage transfer's layout named by the op's attributes (parsed here,
// once, not at each step).
void ParseTransferLayout(const ir::Op& op, Placement* placement, NdSbp* nd_sbp) {
  *placement = Placement::Parse(op.attrs.Get<std::string>("placement"));
  *nd_sbp = NdSbp::Parse(op.attrs.Get<std::string>("nd_sbp"));
}

// Whether `placement` spans more than this one rank.
bool SeveralRanks(const Placement& placement) { return placement.size() > 1; }

}  // namespace

ExecPlan ExecPlan::Lower(const ir::Graph& graph, int rank, const std::vector<char>* runs) {
  EnsureLayoutOps();
  ExecPlan plan;
  plan.graph_ = &graph;
  plan.rank_ = rank;
  plan.runs_of_ = std::make_shared<const passes::StepRuns>(graph, runs);  // checks the units
  const passes::StepRuns& step_runs = *plan.runs_of_;
  static const Attrs kNoAttrs;  // a running sum's `add`
  const std::vector<ir::Op>& ops = graph.ops();
  plan.instructions_.resize(ops.size());
  // One layout (and one GlobalMeta) per value, shared by every tensor a
  // step makes of it.
  std::vector<ValueLayout> layouts(graph.values().size());
  std::vector<char> laid_out(graph.values().size(), 0);
  auto layout_of = [&](int id) -> const ValueLayout& {
    ValueLayout& l = layouts[static_cast<size_t>(id)];
    if (laid_out[static_cast<size_t>(id)]) return l;
    laid_out[static_cast<size_t>(id)] = 1;
    const ir::Value& v = graph.value(id);
    l.logical = v.shape;
    l.shard = v.shape;
    if (v.is_global()) {
      // (Its layout was checked when the value was traced; the world need
      // not be this process's: tessel-plan lowers ranks of other worlds.)
      l.meta = std::make_shared<const GlobalMeta>(v.placement, v.nd_sbp);
      l.shard = LocalBox(v.shape, v.placement, v.nd_sbp, rank).shape();
      l.member = v.placement.Contains(rank);
    }
    return l;
  };

  for (const ir::Op& op : ops) {
    Instruction& ins = plan.instructions_[static_cast<size_t>(op.id)];
    ins.op = op.id;
    ins.runs = runs == nullptr || (*runs)[static_cast<size_t>(op.id)] != 0;
    if (!ins.runs) continue;
    ++plan.runs_;
    const std::string where =
        "graph '" + graph.name() + "': op " + std::to_string(op.id) + " '" + op.name + "'";
    ins.def = &GetOpDef(op.name);
    ins.attrs = &op.attrs;
    ins.inputs = op.inputs;
    ins.outputs = op.outputs;
    int globals = 0;
    for (int in : op.inputs) {
      const ir::Value& v = graph.value(in);
      ins.logical_inputs.push_back({v.shape, v.dtype});
      globals += v.is_global();
    }
    for (int out : op.outputs) {
      const ir::Value& v = graph.value(out);
      ins.logical_outputs.push_back({v.shape, v.dtype});
      ins.output_layouts.push_back(layout_of(out));
    }
    ins.global = globals > 0;
    ins.unit = step_runs.unit(op.id);
    TESSEL_CHECK_CODE(globals == 0 || globals == static_cast<int>(op.inputs.size()), StatusCode::kInternal)
        << where << " mixes local and global inputs";
    if (ins.unit && op.kind == ir::OpKind::kMicroBatch) {
      for (int k = 0; k < step_runs.micro_batches(); ++k) {
        ins.micro_batch_attrs.push_back(op.attrs);
        ins.micro_batch_attrs.back().Set("index", int64_t{k});
      }
    }
    if (step_runs.sum(op.id)) {
      // The running sum: the `add` kernel of the sum so far and a share,
      // both laid out as the sum is.
      const ir::Value& sum = graph.value(op.outputs.at(0));
      ins.kind = Instruction::Kind::kSum;
      ins.def = &GetOpDef("add");
      ins.attrs = &kNoAttrs;
      ins.logical_inputs = {{sum.shape, sum.dtype}, {sum.shape, sum.dtype}};
      if (!ins.global) continue;  // the kernel is found per run by the shares' device
      if (!sum.placement.Contains(rank)) {
        ins.kind = Instruction::Kind::kNotHere;
        continue;
      }
      const Box box = LocalBox(sum.shape, sum.placement, sum.nd_sbp, rank);
      ins.input_boxes = {box, box};
      ins.output_boxes = {box};
      ins.kernel = &KernelFor(*ins.def, sum.placement.device_type());
      continue;
    }

    if (ins.def->run) {
      if (op.kind == ir::OpKind::kToGlobal) {
        ins.kind = Instruction::Kind::kBoxing;
        const ir::Value& from = graph.value(op.inputs.at(0));
        const ir::Value& to = graph.value(op.outputs.at(0));
        TESSEL_CHECK_CODE(from.is_global() && to.is_global(), StatusCode::kInternal)
            << where << " converts a local value";
        if (!(from.placement == to.placement && from.nd_sbp == to.nd_sbp))
          ins.boxing =
              GetBoxingPlan(from.placement, from.nd_sbp, to.placement, to.nd_sbp, from.shape, from.dtype);
        ins.lockstep_request =
            ToGlobalRequest(from.dtype, from.shape, from.placement, from.nd_sbp, to.placement, to.nd_sbp);
        // Within one rank a layout change is a rename or a local copy.
        ins.communicates =
            SeveralRanks(from.placement) || SeveralRanks(to.placement) || !(from.placement == to.placement);
      } else if (op.kind == ir::OpKind::kSend) {
        ins.kind = Instruction::Kind::kSend;
        ParseTransferLayout(op, &ins.peer_placement, &ins.peer_sbp);
        ins.tag = passes::StageTransferTag(op.attrs);
        ins.communicates = true;
      } else if (op.kind == ir::OpKind::kRecv) {
        ins.kind = Instruction::Kind::kRecv;
        const ir::Value& from = graph.value(op.inputs.at(0));
        ins.peer_placement = from.placement;
        ins.peer_sbp = from.nd_sbp;
        ins.tag = passes::StageTransferTag(op.attrs);
        ins.communicates = true;
      } else if (op.kind == ir::OpKind::kFromLocal) {
        // The traced value's logical shape is known: nothing is exchanged
        // (the eager op exchanges shard shapes when it is not given), so a
        // stage's ranks run it alone.
        ins.kind = Instruction::Kind::kFromLocal;
        TESSEL_CHECK_CODE(graph.value(op.outputs.at(0)).is_global(), StatusCode::kInternal)
            << where << " makes a local value";
        ins.communicates = SeveralRanks(graph.value(op.outputs.at(0)).placement);
      } else {
        ins.kind = Instruction::Kind::kSelfRun;
        // A bucket reduces over its inputs' placement.
        ins.communicates = ins.def->communicates && (op.kind != ir::OpKind::kGradientBucket ||
                                                     SeveralRanks(graph.value(op.inputs.at(0)).placement));
      }
      continue;
    }

    if (!ins.global) {
      // A local op: its device is its inputs' (values record none), so the
      // kernel is found per run among the op's few.
      ins.kind = Instruction::Kind::kKernel;
      continue;
    }
    const Placement& placement = graph.value(op.inputs[0]).placement;
    TESSEL_CHECK_CODE(op.input_sbp.size() == op.inputs.size() && op.output_sbp.size() == op.outputs.size(),
                      StatusCode::kInternal)
        << where << " records no layout signature";
    ins.input_boxing.resize(op.inputs.size());
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const ir::Value& v = graph.value(op.inputs[i]);
      TESSEL_CHECK_CODE(v.placement == placement, StatusCode::kInternal)
          << where << " has inputs on " << placement << " and " << v.placement;
      const NdSbp& want = op.input_sbp[i];
      if (v.nd_sbp != want) {
        bool mutated = false;
        for (int m : ins.def->mutates) mutated |= m == static_cast<int>(i);
        TESSEL_CHECK_CODE(!mutated, StatusCode::kInternal)
            << where << " updates " << ins.def->input_name(i) << " (" << v.SpecString()
            << ") in place but runs with it laid out as " << want;
        ins.input_boxing[i] = GetBoxingPlan(placement, v.nd_sbp, placement, want, v.shape, v.dtype);
        ins.communicates |= SeveralRanks(placement);
      }
      ins.input_boxes.push_back(LocalBox(v.shape, placement, want, rank));
    }
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const ir::Value& v = graph.value(op.outputs[o]);
      TESSEL_CHECK_CODE(v.placement == placement && v.nd_sbp == op.output_sbp[o], StatusCode::kInternal)
          << where << " gives %" << v.id << " as " << v.SpecString() << ", its signature says "
          << op.output_sbp[o] << " on " << placement;
      ins.output_boxes.push_back(LocalBox(v.shape, placement, op.output_sbp[o], rank));
    }
    if (!placement.Contains(rank)) {
      ins.kind = Instruction::Kind::kNotHere;
      continue;
    }
    ins.kind = Instruction::Kind::kKernel;
    ins.kernel = &KernelFor(*ins.def, placement.device_type());
  }
  plan.program_order_ = step_runs.ProgramOrder(runs);
  plan.free_after_.assign(static_cast<size_t>(step_runs.slots()), -1);
  std::vector<int> slots;
  for (size_t k = 0; k < plan.program_order_.size(); ++k) {
    const passes::OpRun& r = plan.program_order_[k];
    const ir::Op& op = ops[static_cast<size_t>(r.op)];
    step_runs.InputSlots(op, r.micro_batch, &slots);
    for (size_t o = 0; o < op.outputs.size(); ++o)
      slots.push_back(step_runs.OutputSlot(op, o, r.micro_batch));
    for (int s : slots) plan.free_after_[static_cast<size_t>(s)] = static_cast<int>(k);
  }
  for (const auto& [name, id] : graph.outputs())
    plan.free_after_[static_cast<size_t>(step_runs.Slot(id, -1))] =
        static_cast<int>(plan.program_order_.size());
  return plan;
}

std::vector<Tensor> ExecPlan::Run(const Instruction& ins, std::vector<Tensor>& args, int micro_batch,
                                  PostedSends* posted) const {
  std::vector<Tensor> outs;
  try {
    if (OpProfileEnabled()) {
      outs = ProfileOp(ins.def->name, args, [&] { return RunUnchecked(ins, args, micro_batch, posted); });
    } else {
      outs = RunUnchecked(ins, args, micro_batch, posted);
    }
  } catch (const Error& e) {
    TESSEL_THROW(e.code()) << "graph '" << graph_->name() << "': op " << ins.op << " '"
                           << graph_->ops()[static_cast<size_t>(ins.op)].name << "'"
                           << (ins.unit ? " (micro-batch " + std::to_string(micro_batch) + ")"
                                        : std::string())
                           << " failed: " << e.what();
  }
  TESSEL_CHECK_CODE(outs.size() == ins.outputs.size(), StatusCode::kInternal)
      << "graph '" << graph_->name() << "': op " << ins.op << " '" << ins.def->name << "' gave "
      << outs.size() << " results, the trace recorded " << ins.outputs.size();
  return outs;
}

Tensor ExecPlan::Global(int value, const Tensor& stored) const {
  if (!stored.defined() || stored.is_global() || stored.is_lazy()) return stored;
  const int producer = graph_->value(value).producer;
  if (producer < 0) return stored;
  const Instruction& made_by = instructions_.at(static_cast<size_t>(producer));
  for (size_t o = 0; o < made_by.outputs.size() && o < made_by.output_layouts.size(); ++o) {
    if (made_by.outputs[o] != value) continue;
    const ValueLayout& l = made_by.output_layouts[o];
    return l.meta == nullptr ? stored : WrapShard(stored, l.logical, l.meta, l.shard, l.member);
  }
  return stored;
}

std::vector<Tensor> ExecPlan::RunUnchecked(const Instruction& ins, std::vector<Tensor>& args, int micro_batch,
                                           PostedSends* posted) const {
  const OpDef& def = *ins.def;
  TESSEL_CHECK_CODE(!ins.unit || (0 <= micro_batch && micro_batch < runs_of_->micro_batches()),
                    StatusCode::kInternal)
      << "a unit runs for micro-batch 0.." << runs_of_->micro_batches() - 1 << ", not " << micro_batch;
  const Attrs& attrs = ins.micro_batch_attrs.empty() ? *ins.attrs : ins.micro_batch_attrs[micro_batch];
  const std::optional<uint32_t> tag =
      ins.tag ? std::optional<uint32_t>(runs_of_->Tag(ins.op, *ins.tag, micro_batch)) : std::nullopt;
  if (ins.kind != Instruction::Kind::kKernel && ins.kind != Instruction::Kind::kSum &&
      args.size() == ins.inputs.size()) {
    for (size_t i = 0; i < args.size(); ++i) args[i] = Global(ins.inputs[i], args[i]);
  }
  switch (ins.kind) {
    case Instruction::Kind::kBoxing: {
      if (LockstepChecksEnabled()) CheckLockstep("to_global", ins.lockstep_request);
      if (ins.boxing == nullptr) return {args[0].detach()};
      return {ExecuteBoxing(args[0], *ins.boxing)};
    }
    case Instruction::Kind::kSend:
      if (posted != nullptr) {
        *posted = PostSendSlices(args[0], ins.peer_placement, ins.peer_sbp, tag);
      } else {
        SendSlices(args[0], ins.peer_placement, ins.peer_sbp, tag);
      }
      return {};
    case Instruction::Kind::kRecv:
      return {PostReceive(ins, micro_batch).Wait()};
    case Instruction::Kind::kFromLocal: {
      const ValueLayout& to = ins.output_layouts[0];
      return {FromLocalShard(args[0], to.meta->placement, to.meta->nd_sbp, to.logical)};
    }
    case Instruction::Kind::kSelfRun:
      return def.run(args, attrs);
    case Instruction::Kind::kSum:
      if (args.size() == 1) return {args[0]};  // micro-batch 0's share is the sum so far
      break;
    case Instruction::Kind::kNotHere: {
      if (!def.mutates.empty()) {
        std::vector<Tensor> outs;
        for (int i : def.mutates) outs.push_back(args[static_cast<size_t>(i)]);
        return outs;
      }
      std::vector<Tensor> outs;
      for (size_t o = 0; o < ins.outputs.size(); ++o) {
        const ValueLayout& l = ins.output_layouts[o];
        outs.push_back(WrapShard(Tensor::Empty(l.shard, ins.logical_outputs[o].dtype), l.logical, l.meta,
                                 l.shard,
                                 /*member=*/false));
      }
      return outs;
    }
    case Instruction::Kind::kKernel:
      break;
  }

  if (!ins.global) {
    // (A running sum reads a local share and the sum so far.)
    std::vector<Tensor> locals;
    locals.reserve(args.size());
    for (const Tensor& t : args) locals.push_back(t.detach());
    const Device device = args.empty() ? Device::CPU() : args[0].device();
    for (const Tensor& t : args) {
      TESSEL_CHECK(t.device() == device) << "op '" << def.name << "' has inputs on " << device << " and "
                                         << t.device() << "; move them to one device with .To() first";
    }
    if (!def.mutates.empty()) CheckNoOverlap(def, locals);
    std::vector<Tensor> outs =
        RunKernel(def, device.type(), KernelFor(def, device.type()),
                  KernelContext{locals, attrs, device, nullptr, ins.logical_inputs, ins.logical_outputs});
    if (!def.mutates.empty()) return MutatedInputs(def, args, locals);
    return outs;
  }

  std::vector<Tensor> locals;
  locals.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const BoxingPlan* boxing = ins.input_boxing.empty() ? nullptr : ins.input_boxing[i].get();
    locals.push_back(boxing == nullptr ? args[i].to_local()
                                       : ExecuteBoxing(Global(ins.inputs[i], args[i]), *boxing).to_local());
  }
  if (!def.mutates.empty()) CheckNoOverlap(def, locals);
  const Device device = locals.empty() ? Device::CPU() : locals[0].device();
  std::vector<Tensor> outs =
      RunKernel(def, device.type(), *ins.kernel,
                KernelContext{locals, attrs, device, nullptr, ins.logical_inputs, ins.logical_outputs,
                              &ins.input_boxes, &ins.output_boxes});
  if (!def.mutates.empty()) return MutatedInputs(def, args, locals);
  return outs;  // bare shards (Global wraps them)
}

PostedReceive ExecPlan::PostReceive(const Instruction& ins, int micro_batch) const {
  TESSEL_CHECK_CODE(ins.kind == Instruction::Kind::kRecv, StatusCode::kInternal)
      << "graph '" << graph_->name() << "': op " << ins.op << " '" << ins.def->name << "' is not a receive";
  const ValueLayout& to = ins.output_layouts[0];
  return PostReceiveSlices(
      ins.peer_placement, ins.peer_sbp, to.logical, ins.logical_outputs[0].dtype, to.meta->placement,
      to.meta->nd_sbp,
      ins.tag ? std::optional<uint32_t>(runs_of_->Tag(ins.op, *ins.tag, micro_batch)) : std::nullopt);
}

std::string ExecPlan::ToText() const {
  std::ostringstream os;
  os << "graph '" << graph_->name() << "' on rank " << rank_ << ": " << runs_ << " instructions";
  if (runs_of_->micro_batches() > 1)
    os << " (units marked * run once per micro-batch, " << runs_of_->micro_batches() << " times a step)";
  os << "\n";
  for (const Instruction& ins : instructions_) {
    if (!ins.runs) continue;
    os << "  " << (ins.unit ? "*" : "") << ins.op << " " << KindName(ins.kind) << " "
       << graph_->ops()[static_cast<size_t>(ins.op)].name << "(";
    for (size_t i = 0; i < ins.inputs.size(); ++i) os << (i ? ", " : "") << "%" << ins.inputs[i];
    os << ")";
    if (!ins.outputs.empty()) {
      os << " -> ";
      for (size_t o = 0; o < ins.outputs.size(); ++o) {
        const ValueLayout& l = ins.output_layouts[o];
        os << (o ? ", " : "") << "%" << ins.outputs[o] << " " << DTypeName(ins.logical_outputs[o].dtype)
           << " " << l.shard;
        if (l.meta != nullptr) os << " of " << l.logical << " " << l.meta->nd_sbp;
      }
    }
    if (ins.boxing != nullptr) os << "; " << ins.boxing->bytes_per_rank() << " bytes per rank";
    for (size_t i = 0; i < ins.input_boxing.size(); ++i)
      if (ins.input_boxing[i] != nullptr) os << "; boxes " << ins.def->input_name(i);
    if (ins.kind == Instruction::Kind::kSend || ins.kind == Instruction::Kind::kRecv)
      os << "; " << (ins.kind == Instruction::Kind::kSend ? "to " : "from ") << ins.peer_sbp << " on "
         << ins.peer_placement;
    os << "\n";
  }
  return os.str();
}

}  // namespace tessel::plan
