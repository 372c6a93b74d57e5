#include "tools/plan/gpt_plan.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/join.h"
#include "graph/ir/meta.h"
#include "graph/passes/memory_planning.h"
#include "graph/plan/graph.h"
#include "graph/plan/rank_plan.h"
#include "layers/optimizer.h"
#include "runtime/pipeline_schedule.h"
#include "runtime/rank_schedule.h"
#include "sbp/global_tensor.h"
#include "tools/train/model_config.h"
#include "zoo/config.h"

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

// The sizes the plan reports: the Llama's when one is planned, else the GPT's.
struct ModelShape {
  int64_t layers, hidden, heads, vocab_size, max_seq;
  bool activation_checkpoint;
  static ModelShape Of(const GptPlanOptions& o) {
    if (o.llama)
      return {o.llama->layers,     o.llama->hidden,  o.llama->heads,
              o.llama->vocab_size, o.llama->max_seq, o.llama->activation_checkpoint};
    return {o.model.layers,     o.model.hidden,  o.model.heads,
            o.model.vocab_size, o.model.max_seq, o.model.activation_checkpoint};
  }
};

}  // namespace

GptPlan PlanGpt(const GptPlanOptions& o) {
  const ModelShape shape = ModelShape::Of(o);
  const int64_t world = o.tensor_parallel_size * o.pipeline_parallel_size * o.data_parallel_size;
  TESSEL_CHECK(o.tensor_parallel_size >= 1 && o.pipeline_parallel_size >= 1 && o.data_parallel_size >= 1)
      << "tensor (" << o.tensor_parallel_size << "), pipeline (" << o.pipeline_parallel_size << ") and data ("
      << o.data_parallel_size << ") parallel sizes must be >= 1";
  TESSEL_CHECK(o.micro_batch_size >= 1 && o.micro_batches >= 1)
      << "micro_batch_size " << o.micro_batch_size << " and micro_batches " << o.micro_batches
      << " must be >= 1";
  const int64_t seq = o.seq > 0 ? o.seq : shape.max_seq;
  const std::string schedule = o.schedule == "in_order" ? o.schedule : runtime::ParseSchedule(o.schedule);
  TESSEL_CHECK(o.machine == nullptr || schedule != "in_order")
      << "a step time is estimated under a pipeline schedule; in_order is the reference executor's";
  GptPlan out;
  out.world_size = static_cast<int>(world);
  const auto start = std::chrono::steady_clock::now();
  MetaScope meta(static_cast<int>(world), o.rank);
  dist::Setup({.data_parallel_size = o.data_parallel_size,
               .tensor_parallel_size = o.tensor_parallel_size,
               .pipeline_parallel_size = o.pipeline_parallel_size,
               .pipeline_num_layers = shape.layers,
               .virtual_pipeline_size = o.virtual_pipeline_size,
               .zero_stage = o.zero_stage,
               .sequence_parallel = o.sequence_parallel,
               .all_to_all_sequence_parallel = o.all_to_all_sequence_parallel,
               .context_parallel = o.context_parallel,
               .tensor_parallel_mode = o.tensor_parallel_mode,
               .tensor_parallel_mode_options = o.tensor_parallel_mode_options});
  std::unique_ptr<nn::Module> model;
  std::function<Tensor(const Tensor&, const Tensor&)> loss;
  if (o.llama) {
    auto llama = std::make_unique<models::Llama>(*o.llama);
    loss = [m = llama.get()](const Tensor& ids, const Tensor& labels) { return m->Loss(ids, labels); };
    model = std::move(llama);
  } else {
    auto gpt = std::make_unique<models::GPT>(o.model);
    loss = [m = gpt.get()](const Tensor& ids, const Tensor& labels) { return m->Loss(ids, labels); };
    model = std::move(gpt);
  }
  auto params = model->NamedParameters();
  optim::AdamW adamw(params, {.zero_stage = o.zero_stage});
  // The step tessel-train runs in graph mode: the mean loss, backward,
  // gradients clipped to norm 1, AdamW.
  Graph step("train_step",
             [&](const Graph::Tensors& in) {
               Tensor l = loss(in.at("ids"), in.at("labels"));
               l.backward();
               Tensor grad_norm = optim::ClipGradNormTensor(params, 1.0, adamw.GradientLayouts());
               adamw.Step();
               return Graph::Tensors{{"loss", l}, {"grad_norm", grad_norm}};
             },
             {.micro_batches = static_cast<int>(o.micro_batches),
              .stage_ranks = dist::StageRanks(),
              .layer_stages = dist::LayerStages()});
  // Under all-to-all sequence parallelism and context parallelism the dp
  // ranks share each micro-batch's rows.
  const bool split_sequences = o.all_to_all_sequence_parallel || o.context_parallel;
  const Shape batch(
      {o.micro_batch_size * (split_sequences ? 1 : o.data_parallel_size) * o.micro_batches, seq});
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
      t.count += op.runs();
      t.elements += c.elements() * op.runs();
      t.bytes += c.bytes() * op.runs();
    }
  }
  auto parameter_bytes_of = [&](int rank) {
    int64_t bytes = 0;
    for (const auto& [name, p] : params) {
      if (!p->placement().Contains(rank)) continue;
      bytes += LocalBox(p->shape(), p->placement(), p->nd_sbp(), rank).numel() *
               static_cast<int64_t>(ElementSize(p->dtype()));
    }
    return bytes;
  };
  out.parameter_bytes = parameter_bytes_of(o.rank);
  // Memory per stage: the rank at --rank's place in each stage's [dp, tp]
  // grid, its ops in the order the actor runtime would run them.
  const bool bf16 = o.precision == GptPlanOptions::Precision::kBf16;
  for (int64_t stage = 0; stage < o.pipeline_parallel_size; ++stage) {
    const int rank = static_cast<int>(stage * o.data_parallel_size * o.tensor_parallel_size +
                                      o.rank % (o.data_parallel_size * o.tensor_parallel_size));
    passes::MemoryPlanOptions memory_options{.compute_element_bytes = bf16 ? 2 : 0};
    std::optional<runtime::RankSchedule> ranked;  // (its runs stay for the memory plan)
    StageMemory s{.stage = static_cast<int>(stage), .rank = rank};
    if (schedule != "in_order") {
      ranked = runtime::ScheduleRank(graph, rank, schedule);
      if (o.machine != nullptr) {
        proto::RankPlanProto comms;
        CompileRankPlan(ranked->exec, &comms);
        out.stage_times.push_back(TimeStage(graph, *ranked, comms, *o.machine));
      }
      memory_options.order = std::move(ranked->order);
      memory_options.runs = &ranked->exec.runs();
      s.in_flight = runtime::MaxInFlight(ranked->actions);
    }
    const passes::MemoryPlan m = passes::PlanMemory(graph, rank, memory_options);
    // With bf16 the traced f32 parameters are the masters; the model's bf16
    // copies come on top.
    s.variable_bytes = m.variable_bytes + (bf16 ? parameter_bytes_of(rank) / 2 : 0);
    s.activation_bytes = m.peak_activation_bytes;
    s.peak_bytes = m.peak_bytes;
    s.input_bytes = m.input_bytes;
    out.stages.push_back(s);
  }
  if (o.machine != nullptr)
    out.estimate = PlayPipeline(out.stage_times, static_cast<int>(o.micro_batches),
                                static_cast<int>(o.virtual_pipeline_size));
  const double p = static_cast<double>(o.pipeline_parallel_size), m = static_cast<double>(o.micro_batches),
               v = static_cast<double>(o.virtual_pipeline_size);
  out.bubble_fraction = (p - 1) / (v * m + p - 1);
  return out;
}

std::string GptPlanText(const GptPlanOptions& o, const GptPlan& plan) {
  std::ostringstream os;
  const ModelShape shape = ModelShape::Of(o);
  const int64_t seq = o.seq > 0 ? o.seq : shape.max_seq;
  os << (o.llama ? "Llama: " : "GPT: ") << shape.layers << " layers, hidden " << shape.hidden << ", "
     << shape.heads << " heads"
     << (o.llama ? " on " + std::to_string(o.llama->key_value_heads()) + " key/value heads" : std::string())
     << ", vocabulary " << shape.vocab_size << ", sequence " << seq << "\n"
     << "world " << plan.world_size << " = pp " << o.pipeline_parallel_size << " x dp "
     << o.data_parallel_size << " x tp " << o.tensor_parallel_size;
  if (o.tensor_parallel_mode != "1d")
    os << " (" << o.tensor_parallel_mode << ", tensor mesh [" << Join(dist::TensorMesh()) << "])";
  os << "; rank " << o.rank << " is on stage " << plan.stage << "\n"
     << "step: " << o.micro_batches << " micro-batch(es) of " << o.micro_batch_size
     << (o.all_to_all_sequence_parallel || o.context_parallel
             ? " sequence(s), shared by the dp group, each rank holding 1/dp of every sequence (b*s*h of the "
               "micro-batch = "
             : " sequence(s) per data-parallel rank (b*s*h = ")
     << o.micro_batch_size * seq * shape.hidden << " elements)\n"
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
  using passes::FormatBytes;
  const bool bf16 = o.precision == GptPlanOptions::Precision::kBf16;
  os << "memory per rank under " << (o.schedule == "in_order" ? "in-order execution" : o.schedule) << ", "
     << (bf16 ? "bf16 compute with f32 master weights and AdamW state" : "f32")
     << (shape.activation_checkpoint ? ", every layer recomputed in backward" : "")
     << (o.zero_stage > 0 ? ", ZeRO stage " + std::to_string(o.zero_stage) : std::string())
     << " (one rank of each stage; op results: activations, gradients and temporaries alive at once):\n"
     << "  stage   rank  in flight     variables   activations    op results         total\n";
  const StageMemory* most = nullptr;
  std::vector<int> too_big;
  for (const StageMemory& s : plan.stages) {
    os << "  " << std::left << std::setw(5) << s.stage << std::right << std::setw(7) << s.rank
       << std::setw(11) << (s.in_flight >= 0 ? std::to_string(s.in_flight) : std::string("-"))
       << std::setw(14) << FormatBytes(s.variable_bytes) << std::setw(14) << FormatBytes(s.activation_bytes)
       << std::setw(14) << FormatBytes(s.peak_bytes) << std::setw(14) << FormatBytes(s.total_bytes());
    if (o.device_memory_bytes > 0 && s.total_bytes() > o.device_memory_bytes) {
      os << "  does not fit";
      too_big.push_back(s.stage);
    }
    os << "\n";
    if (!most || s.total_bytes() > most->total_bytes()) most = &s;
  }
  if (o.device_memory_bytes > 0 && most) {
    const double share =
        100.0 * static_cast<double>(most->total_bytes()) / static_cast<double>(o.device_memory_bytes);
    os << std::fixed << std::setprecision(0);
    if (too_big.empty())
      os << "fits " << FormatBytes(o.device_memory_bytes) << " per device: the largest, stage " << most->stage
         << ", needs " << FormatBytes(most->total_bytes()) << " (" << share << "%)\n";
    else
      os << "does not fit " << FormatBytes(o.device_memory_bytes) << " per device: stage"
         << (too_big.size() > 1 ? "s " : " ") << Join(too_big) << " need" << (too_big.size() > 1 ? "" : "s")
         << " more; the largest, stage " << most->stage << ", needs " << FormatBytes(most->total_bytes())
         << " (" << share << "%)"
         << (shape.activation_checkpoint ? ""
                                         : "; recomputing each layer (train.activation_checkpoint) keeps one "
                                           "input per layer and micro-batch instead")
         << "\n";
  }
  os << "not counted: the device runtime's context and library workspaces, allocator fragmentation beyond "
        "its size classes\n";
  if (o.machine != nullptr) {
    const StepEstimate& e = plan.estimate;
    const StageTimes& critical = plan.stage_times.at(static_cast<size_t>(e.critical_stage));
    double peak = 0;
    for (const auto& [flops, rate] : o.machine->gemm) peak = std::max(peak, rate);
    const double rate = critical.gemm_flops / e.step_s;
    os << o.machine->Text() << std::fixed << std::setprecision(1) << "step time estimate under " << o.schedule
       << ": " << 1e3 * e.step_s << " ms (stage " << e.critical_stage << " ends last: busy " << 1e3 * e.busy_s
       << " ms, of which communication " << 1e3 * e.communication_s << " ms; waiting "
       << 1e3 * (e.step_s - e.busy_s) << " ms); its matmuls " << std::setprecision(2) << rate / 1e9
       << " GFLOP/s, " << std::setprecision(0) << 100 * rate / peak << "% of the fastest measured matmul\n";
  }
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

GptPlanOptions GptPlanOptionsFromConfig(const config::Config& config, int world_size) {
  // The plan is of the graph-mode step on the config's layout. Mixed
  // precision is CUDA's, graph mode CPU's so far: the config is checked as
  // a CPU job, and train.amp becomes the plan's precision.
  config::Config c = config;
  const bool amp = c.train().amp().enabled();
  TESSEL_CHECK(!amp || c.train().amp().dtype() == "bf16" || c.train().amp().dtype() == "f16")
      << "config: train.amp.dtype is '" << c.train().amp().dtype() << "'; expected bf16 or f16";
  c.mutable_train()->mutable_amp()->set_enabled(false);
  c.mutable_train()->mutable_dist()->set_device("cpu");
  zoo::ResolveConfig(&c, world_size);
  TESSEL_CHECK(c.model().arch() == "gpt2" || c.model().arch() == "llama")
      << "tessel-plan plans GPT-2 and Llama jobs; this config's model.arch is '" << c.model().arch() << "'";
  const config::TrainConfig& t = c.train();
  const config::DistConfig& d = t.dist();
  TESSEL_CHECK(d.custom_pipeline_stage_id_size() == 0)
      << "tessel-plan plans the even split of layers over stages; this config sets "
         "train.dist.custom_pipeline_stage_id";
  GptPlanOptions o{.tensor_parallel_size = d.tensor_parallel_size(),
                   .pipeline_parallel_size = d.pipeline_parallel_size(),
                   .data_parallel_size = d.data_parallel_size(),
                   .virtual_pipeline_size = d.virtual_pipeline_size(),
                   .micro_batch_size = t.micro_batch_size(),
                   .micro_batches = t.num_accumulation_steps(),
                   .seq = c.model().max_seq_length(),
                   .sequence_parallel = zoo::MegatronSequenceParallel(d),
                   .all_to_all_sequence_parallel = zoo::AllToAllSequenceParallel(d),
                   .context_parallel = zoo::ContextParallel(d),
                   .zero_stage = t.zero_optimization().enabled() ? t.zero_optimization().stage() : 0,
                   .tensor_parallel_mode = d.tensor_parallel_mode(),
                   .schedule = t.graph().pipeline()};
  if (c.model().arch() == "llama")
    o.llama = train::LlamaConfigOf(c);
  else
    o.model = train::GptConfigOf(c);
  for (const auto& [key, value] : d.tensor_parallel_mode_options())
    o.tensor_parallel_mode_options[key] = value;
  if (amp) o.precision = GptPlanOptions::Precision::kBf16;  // f16 holds the same bytes
  return o;
}

int64_t ParseByteSize(const std::string& text) {
  static const std::map<std::string, double> kUnits = {
      {"", 1},        {"B", 1},         {"KB", 1e3},      {"MB", 1e6},      {"GB", 1e9},
      {"TB", 1e12},   {"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 0x1p40},
      {"K", 1 << 10}, {"M", 1 << 20},   {"G", 1 << 30},   {"T", 0x1p40}};
  const char* begin = text.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  std::string unit = end ? std::string(end) : std::string();
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  const auto found = kUnits.find(unit);
  TESSEL_CHECK(end != begin && found != kUnits.end() && std::isfinite(number) && number > 0 &&
               number * found->second < 0x1p62)
      << "memory size '" << text << "'; expected a positive number with a unit, e.g. 80GiB, 40GB, 512MiB";
  return static_cast<int64_t>(number * found->second);
}

}  // namespace tessel::plan
