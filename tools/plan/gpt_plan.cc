#include "tools/plan/gpt_plan.h"

#include <chrono>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "core/join.h"
#include "graph/ir/meta.h"
#include "graph/passes/memory_planning.h"
#include "graph/plan/graph.h"
#include "graph/plan/rank_plan.h"
#include "layers/optimizer.h"
#include "sbp/global_tensor.h"

namespace tessel::plan {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Layout {
  int64_t dp, tp;
  std::vector<int64_t> tensor_mesh;  // {tp} under 1d
  int64_t Stage(int r) const { return r / (dp * tp); }
  int64_t DpIndex(int r) const { return (r % (dp * tp)) / tp; }
  int64_t TpIndex(int r) const { return r % tp; }
  // The index along tensor-mesh axis `axis` (row-major, the last innermost).
  int64_t TensorIndex(int r, size_t axis) const {
    int64_t t = TpIndex(r);
    for (size_t a = tensor_mesh.size(); a-- > axis + 1;) t /= tensor_mesh[a];
    return t % tensor_mesh[axis];
  }

  std::string GroupOf(const proto::CommProto& c, int rank) const {
    if ((c.kind() == "send" || c.kind() == "recv") && Stage(c.ranks(0)) != Stage(rank)) return "pp";
    bool one_stage = true, one_dp = true, one_tp = true;
    for (int r : c.ranks()) {
      one_stage &= Stage(r) == Stage(rank);
      one_dp &= DpIndex(r) == DpIndex(rank);
      one_tp &= TpIndex(r) == TpIndex(rank);
    }
    if (one_stage && one_dp && tensor_mesh.size() > 1) {
      // The tensor-mesh axes the group spans: one names it.
      std::vector<size_t> varying;
      for (size_t a = 0; a < tensor_mesh.size(); ++a)
        for (int r : c.ranks())
          if (TensorIndex(r, a) != TensorIndex(rank, a)) {
            varying.push_back(a);
            break;
          }
      if (varying.size() == 1) return "tp" + std::to_string(varying[0]);
    }
    if (one_stage && one_dp) return "tp";
    if (one_stage && one_tp) return "dp";
    return "other";
  }
};

}  // namespace

GptPlan PlanGpt(const GptPlanOptions& o) {
  const int64_t world = o.tensor_parallel_size * o.pipeline_parallel_size * o.data_parallel_size;
  TESSEL_CHECK(o.tensor_parallel_size >= 1 && o.pipeline_parallel_size >= 1 && o.data_parallel_size >= 1)
      << "tensor (" << o.tensor_parallel_size << "), pipeline (" << o.pipeline_parallel_size << ") and data ("
      << o.data_parallel_size << ") parallel sizes must be >= 1";
  TESSEL_CHECK(o.micro_batch_size >= 1 && o.micro_batches >= 1)
      << "micro_batch_size " << o.micro_batch_size << " and micro_batches " << o.micro_batches
      << " must be >= 1";
  const int64_t seq = o.seq > 0 ? o.seq : o.model.max_seq;
  GptPlan out;
  out.world_size = static_cast<int>(world);
  const auto start = std::chrono::steady_clock::now();
  MetaScope meta(static_cast<int>(world), o.rank);
  dist::Setup({.data_parallel_size = o.data_parallel_size,
               .tensor_parallel_size = o.tensor_parallel_size,
               .pipeline_parallel_size = o.pipeline_parallel_size,
               .pipeline_num_layers = o.model.layers,
               .virtual_pipeline_size = o.virtual_pipeline_size,
               .zero_stage = o.zero_stage,
               .sequence_parallel = o.sequence_parallel,
               .all_to_all_sequence_parallel = o.all_to_all_sequence_parallel,
               .tensor_parallel_mode = o.tensor_parallel_mode,
               .tensor_parallel_mode_options = o.tensor_parallel_mode_options});
  models::GPT gpt(o.model);
  auto params = gpt.NamedParameters();
  optim::AdamW adamw(params, {.zero_stage = o.zero_stage});
  // The step train_gpt --graph runs.
  Graph step("train_step",
             [&](const Graph::Tensors& in) { return models::TrainStep(gpt, params, adamw, in); },
             {.micro_batches = static_cast<int>(o.micro_batches),
              .stage_ranks = dist::StageRanks(),
              .layer_stages = dist::LayerStages()});
  const Shape batch({o.micro_batch_size * o.data_parallel_size * o.micro_batches, seq});
  const ir::Graph& graph = step.Trace(
      {{"ids", MakeMetaLocal(batch, DType::kInt64)}, {"labels", MakeMetaLocal(batch, DType::kInt64)}});
  out.compile_seconds = SecondsSince(start);
  out.logical_ops = static_cast<int64_t>(graph.ops().size());
  if (o.want_dot) out.dot = graph.ToDot();

  const auto plan_start = std::chrono::steady_clock::now();
  CompileRankPlan(graph, o.rank, &out.plan, o.want_instructions ? &out.instructions : nullptr);
  out.rank_plan_seconds = SecondsSince(plan_start);

  const Layout layout{o.data_parallel_size, o.tensor_parallel_size, dist::TensorMesh()};
  out.stage = static_cast<int>(layout.Stage(o.rank));
  for (const proto::PlanOpProto& op : out.plan.ops()) {
    for (const proto::CommProto& c : op.comms()) {
      CommTally& t =
          out.comm[{op.has_layer() ? op.layer() : -1, op.backward(), layout.GroupOf(c, o.rank), c.kind()}];
      ++t.count;
      t.elements += c.elements();
      t.bytes += c.bytes();
    }
  }
  for (const auto& [name, p] : params) {
    if (!p->placement().Contains(o.rank)) continue;
    out.parameter_bytes += LocalBox(p->shape(), p->placement(), p->nd_sbp(), o.rank).numel() *
                           static_cast<int64_t>(ElementSize(p->dtype()));
  }
  const double p = static_cast<double>(o.pipeline_parallel_size), m = static_cast<double>(o.micro_batches),
               v = static_cast<double>(o.virtual_pipeline_size);
  out.bubble_fraction = (p - 1) / (v * m + p - 1);
  return out;
}

std::string GptPlanText(const GptPlanOptions& o, const GptPlan& plan) {
  std::ostringstream os;
  const int64_t seq = o.seq > 0 ? o.seq : o.model.max_seq;
  os << "GPT: " << o.model.layers << " layers, hidden " << o.model.hidden << ", " << o.model.heads
     << " heads, vocabulary " << o.model.vocab_size << ", sequence " << seq << "\n"
     << "world " << plan.world_size << " = pp " << o.pipeline_parallel_size << " x dp "
     << o.data_parallel_size << " x tp " << o.tensor_parallel_size;
  if (o.tensor_parallel_mode != "1d")
    os << " (" << o.tensor_parallel_mode << ", tensor mesh [" << Join(dist::TensorMesh()) << "])";
  os << "; rank " << o.rank << " is on stage " << plan.stage << "\n"
     << "step: " << o.micro_batches << " micro-batch(es) of " << o.micro_batch_size
     << (o.all_to_all_sequence_parallel
             ? " sequence(s) per data-parallel rank, shared by the dp group, each rank holding 1/dp of every "
               "sequence (tokens x h per rank = "
             : " sequence(s) per data-parallel rank (b*s*h = ")
     << o.micro_batch_size * seq * o.model.hidden << " elements)\n"
     << std::fixed << std::setprecision(2) << "compiled the logical graph (" << plan.logical_ops
     << " ops) in " << plan.compile_seconds << " s and rank " << o.rank << "'s plan (" << plan.plan.ops_size()
     << " ops) in " << plan.rank_plan_seconds << " s\n";
  os << "\ncommunication per step, by layer (elements of this rank's buffers):\n"
     << "  layer     pass      group  kind            count      elements         bytes\n";
  for (const auto& [k, t] : plan.comm) {
    os << "  " << std::left << std::setw(9) << (k.layer >= 0 ? std::to_string(k.layer) : std::string("-"))
       << " " << std::setw(9) << (k.backward ? "backward" : "forward") << " " << std::setw(6) << k.group
       << " " << std::setw(14) << k.kind << std::right << std::setw(7) << t.count << std::setw(14)
       << t.elements << std::setw(14) << t.bytes << "\n";
  }
  std::map<std::pair<std::string, std::string>, CommTally> totals;
  for (const auto& [k, t] : plan.comm) {
    CommTally& s = totals[{k.group, k.kind}];
    s.count += t.count;
    s.elements += t.elements;
    s.bytes += t.bytes;
  }
  os << "communication per step, by group:\n";
  for (const auto& [k, t] : totals) {
    os << "  " << std::left << std::setw(6) << k.first << " " << std::setw(14) << k.second << std::right
       << std::setw(7) << t.count << " ops" << std::setw(16) << t.bytes << " bytes\n";
  }
  const proto::MemoryProto& m = plan.plan.memory();
  using passes::FormatBytes;
  os << "memory of rank " << o.rank << ": parameters " << FormatBytes(plan.parameter_bytes)
     << "; variables (parameters and AdamW state) " << FormatBytes(m.variable_bytes())
     << "; op results at most " << FormatBytes(m.peak_bytes()) << " (at op " << m.peak_op() << " '"
     << m.peak_op_name() << "'), activations at most " << FormatBytes(m.peak_activation_bytes()) << "\n";
  if (o.virtual_pipeline_size > 1)
    os << "pipeline: " << o.pipeline_parallel_size << " stage(s) of " << o.virtual_pipeline_size
       << " chunks, " << o.micro_batches
       << " micro-batch(es): bubble (p-1)/(vm+p-1) = " << std::setprecision(1) << 100 * plan.bubble_fraction
       << "% of a step (interleaved 1F1B, equal stages)\n";
  else
    os << "pipeline: " << o.pipeline_parallel_size << " stage(s), " << o.micro_batches
       << " micro-batch(es): bubble (p-1)/(m+p-1) = " << std::setprecision(1) << 100 * plan.bubble_fraction
       << "% of a step (GPipe and 1F1B, equal stages)\n";
  return os.str();
}

}  // namespace tessel::plan
