#include "parallel/parallelize.h"

#include <glog/logging.h>

#include <chrono>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "graph/ir/meta.h"
#include "graph/ir/tracer.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "parallel/cost_model.h"
#include "parallel/plan_file.h"
#include "parallel/stage_placer.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::parallel {

namespace {

// Stage s holds ranks [s*n, (s+1)*n) as [data x replicas, tensor], axes of
// size 1 dropped (a stage of one rank is [1]).
std::vector<Placement> StagePlacements(const ParallelPlan& plan, int64_t replicas, DeviceType device) {
  const int64_t dp = plan.data_parallel * replicas, tp = plan.tensor_parallel, per_stage = dp * tp;
  std::vector<int64_t> hierarchy;
  if (dp > 1) hierarchy.push_back(dp);
  if (tp > 1) hierarchy.push_back(tp);
  if (hierarchy.empty()) hierarchy.push_back(1);
  std::vector<Placement> stages;
  for (int64_t s = 0; s < plan.stages; ++s) {
    std::vector<int> ranks(static_cast<size_t>(per_stage));
    std::iota(ranks.begin(), ranks.end(), static_cast<int>(s * per_stage));
    stages.emplace_back(device, ranks, hierarchy);
  }
  return stages;
}

// A [data, tensor] pair of entries on such a grid.
NdSbp GridSbp(const ParallelPlan& plan, int64_t replicas, const Sbp& data, const Sbp& tensor) {
  std::vector<Sbp> sbps;
  if (plan.data_parallel * replicas > 1) sbps.push_back(data);
  if (plan.tensor_parallel > 1) sbps.push_back(tensor);
  if (sbps.empty()) sbps.push_back(B());
  return NdSbp(sbps);
}

NdSbp ParameterSbp(const ParallelPlan& plan, int64_t replicas, const std::string& name) {
  auto it = plan.parameter_split.find(name);
  return GridSbp(plan, replicas, B(), it == plan.parameter_split.end() ? B() : it->second);
}
NdSbp InputSbp(const ParallelPlan& plan, int64_t replicas) { return GridSbp(plan, replicas, S(0), B()); }
NdSbp Replicated(const Placement& p) { return NdSbp(std::vector<Sbp>(static_cast<size_t>(p.ndim()), B())); }

int StageOrFirst(const std::map<std::string, int>& stages, const std::string& name) {
  auto it = stages.find(name);
  return it == stages.end() ? 0 : it->second;
}

std::string SpecsText(const Tensors& inputs) {
  std::string out;
  for (const auto& [name, t] : inputs)
    out += (out.empty() ? "" : ", ") + name + " " + std::string(DTypeName(t.dtype())) + " " +
           t.shape().ToString();
  return out;
}

// Puts other tensors in a module's parameter slots for a scope.
class ParameterSwap {
 public:
  explicit ParameterSwap(nn::Module& m) : params_(m.NamedParameters()) {
    for (auto& [name, p] : params_) saved_.push_back(*p);
  }
  ~ParameterSwap() {
    for (size_t i = 0; i < params_.size(); ++i) *params_[i].second = saved_[i];
  }
  std::vector<std::pair<std::string, Tensor*>>& params() { return params_; }

 private:
  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<Tensor> saved_;
};

// The model's forward on the sample batch, traced on one device.
std::unique_ptr<ir::Graph> TraceOneDevice(nn::LossModule& module, const Tensors& sample) {
  auto g = std::make_unique<ir::Graph>("one_device_forward");
  TracingInterpreter tracer(*g);
  InterpreterScope scope(tracer);
  for (auto& [name, p] : module.NamedParameters()) tracer.AddVariable(name, *p);
  Tensors lazy;
  for (const auto& [name, t] : sample) lazy[name] = tracer.Input(name, t);
  Tensor loss;
  try {
    loss = module.Loss(lazy);
  } catch (const std::exception& e) {
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "parallelize: the model's forward refused the sample inputs (" << SpecsText(sample)
        << "): " << e.what();
  }
  TESSEL_CHECK(loss.defined() && loss.shape().numel() == 1 && IsFloating(loss.dtype()))
      << "parallelize: the model's Loss gave " << (loss.defined() ? loss.shape().ToString() : "no tensor")
      << "; expected a floating scalar";
  g->MarkOutput("loss", tracer.ValueOf(loss, "the loss"));
  // A layer that draws masks keeps its counter beside its input, made at
  // its first draw; the traces under other layouts below would each need it
  // beside theirs.
  for (const ir::Op& op : g->ops()) {
    TESSEL_CHECK(op.name != "rng_advance")
        << "parallelize: the model draws random masks (op " << op.id << " '" << op.name
        << "', a Dropout with p > 0); parallelize does not yet carry a dropout's counter across the layouts "
           "it "
           "plans: set the dropout probabilities to 0 (the parallel layers and tessel-train train with "
           "dropout)";
  }
  return g;
}

// The forward traced again under a tentative plan, metadata only (one plan
// copy): the layouts inference gives every value.
std::unique_ptr<ir::Graph> TraceUnderPlan(nn::LossModule& module, const Tensors& sample,
                                          const ir::Graph& one_device, const ParallelPlan& plan,
                                          DeviceType device) {
  const std::vector<Placement> stages = StagePlacements(plan, 1, device);
  const std::map<std::string, int> first = FirstUseStages(one_device, plan.op_stage);
  MetaScope meta(static_cast<int>(plan.ranks()), 0);
  ParameterSwap swap(module);
  auto g = std::make_unique<ir::Graph>("policy_trace");
  TracingInterpreter tracer(*g);
  InterpreterScope trace_scope(tracer);
  for (auto& [name, p] : swap.params()) {
    const Placement& placement = stages[static_cast<size_t>(StageOrFirst(first, name))];
    *p = zeros(p->shape(), placement, ParameterSbp(plan, 1, name), p->dtype());
    tracer.AddVariable(name, *p);
  }
  Tensors lazy;
  for (const auto& [name, t] : sample)
    lazy[name] = tracer.Input(name, zeros(t.shape(), stages[static_cast<size_t>(StageOrFirst(first, name))],
                                          InputSbp(plan, 1), t.dtype()));
  StagePlacer placer(tracer, stages);
  InterpreterScope placer_scope(placer);
  const Tensor loss = module.Loss(lazy);
  g->MarkOutput("loss", tracer.ValueOf(loss, "the loss"));
  return g;
}

// Throws naming what a policy's plan gets wrong.
void CheckPlan(const ParallelPlan& plan, const ir::Graph& g, const ComputeConfig& config,
               const std::set<std::string>& parameters, const std::map<std::string, Shape>& shapes) {
  const std::string who = "policy '" + plan.policy + "'";
  TESSEL_CHECK(plan.data_parallel >= 1 && plan.tensor_parallel >= 1 && plan.stages >= 1 &&
               plan.ranks() == config.plan_ranks)
      << who << ": data " << plan.data_parallel << " x tensor " << plan.tensor_parallel << " x stages "
      << plan.stages << " = " << plan.ranks() << " ranks; plan_ranks is " << config.plan_ranks;
  TESSEL_CHECK(plan.micro_batches >= 1)
      << who << ": " << plan.micro_batches << " micro-batches; expected 1 or more";
  TESSEL_CHECK(plan.op_stage.size() == g.ops().size()) << who << " gave stages for " << plan.op_stage.size()
                                                       << " ops; the model's forward has " << g.ops().size();
  for (const ir::Op& op : g.ops()) {
    const int s = plan.op_stage[static_cast<size_t>(op.id)];
    TESSEL_CHECK(s >= 0 && s < plan.stages)
        << who << " leaves op " << op.id << " '" << op.name << "' without a placement (stage " << s
        << "; expected 0.." << plan.stages - 1 << ")";
    for (int v : op.inputs) {
      const int producer = g.value(v).producer;
      if (producer < 0) continue;
      const int from = plan.op_stage[static_cast<size_t>(producer)];
      TESSEL_CHECK(from <= s) << who << " puts op " << op.id << " '" << op.name << "' on stage " << s
                              << ", before op " << producer << " '"
                              << g.ops()[static_cast<size_t>(producer)].name << "' on stage " << from
                              << " whose result it reads (forward values only flow to "
                              << "later stages)";
    }
  }
  for (const auto& [name, sbp] : plan.parameter_split) {
    TESSEL_CHECK(parameters.count(name))
        << who << " splits '" << name << "', which is no parameter of the model";
    const Shape& shape = shapes.at(name);
    TESSEL_CHECK(sbp.is_broadcast() || (sbp.is_split() && sbp.axis() < shape.ndim()))
        << who << " lays parameter '" << name << "' " << shape << " out as " << NdSbp({sbp}).ToString()
        << " over tensor; expected B or S(d) with d < " << shape.ndim();
  }
}

}  // namespace

std::unique_ptr<ParallelModule> parallelize(nn::LossModule& module, const Tensors& sample_inputs,
                                            const std::string& policy, const ComputeConfig& config) {
  return parallelize(module, sample_inputs, GetPolicy(policy), config);
}

namespace {
// The parameters' names and shapes, refusing a model already laid out.
std::map<std::string, Shape> LocalParameterShapes(nn::LossModule& module) {
  std::map<std::string, Shape> shapes;
  for (auto& [name, p] : module.NamedParameters()) {
    TESSEL_CHECK(!p->is_global()) << "parallelize takes a model written for one device; parameter '" << name
                                  << "' is already global on " << p->placement().ToString();
    shapes[name] = p->shape();
  }
  return shapes;
}

// A few training steps of the model under `plan` on the sample batch, in
// a scratch layout (the module's parameters are put back after); the mean
// step time over the ranks, so all see the same figure.
double MeasurePlan(nn::LossModule& module, const Tensors& sample, const ir::Graph& one_device,
                   const ParallelPlan& plan, const ComputeConfig& config) {
  ParameterSwap keep(module);
  double seconds = 0;
  {
    ParallelModule scratch(module, plan, config, sample, FirstUseStages(one_device, plan.op_stage));
    optim::AdamW still(scratch.NamedParameters(), {.lr = 0, .weight_decay = 0});
    scratch.TrainStep(sample, still);
    constexpr int kSteps = 2;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kSteps; ++i) scratch.TrainStep(sample, still);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kSteps;
  }
  return MeanOverRanks({seconds})[0];
}

ParallelPlan PlanWithGraph(nn::LossModule& module, const Tensors& sample_inputs, const Policy& policy,
                           const ComputeConfig& config, std::unique_ptr<ir::Graph>* one_device_out,
                           bool may_run) {
  TESSEL_CHECK(config.plan_ranks >= 1 && config.runtime_ranks >= 1 &&
               config.runtime_ranks % config.plan_ranks == 0)
      << "parallelize: runtime_ranks=" << config.runtime_ranks
      << " is not a multiple of plan_ranks=" << config.plan_ranks;
  TESSEL_CHECK(!sample_inputs.empty()) << "parallelize: no sample inputs";
  for (const auto& [name, t] : sample_inputs)
    TESSEL_CHECK(t.defined() && !t.is_global()) << "parallelize: sample input '" << name
                                                << "' must be a local tensor (the whole batch on every rank)";
  const std::map<std::string, Shape> shapes = LocalParameterShapes(module);
  std::set<std::string> parameters;
  for (const auto& [name, shape] : shapes) parameters.insert(name);

  std::unique_ptr<ir::Graph> one_device = TraceOneDevice(module, sample_inputs);
  PolicyContext context{*one_device, parameters, config, nullptr, nullptr};
  context.trace = [&](const ParallelPlan& plan) {
    return TraceUnderPlan(module, sample_inputs, *one_device, plan, config.device_type);
  };
  if (may_run)
    context.measure = [&](const ParallelPlan& plan) {
      CheckPlan(plan, *one_device, config, parameters, shapes);
      return MeasurePlan(module, sample_inputs, *one_device, plan, config);
    };
  ParallelPlan plan = policy(context);
  CheckPlan(plan, *one_device, config, parameters, shapes);
  plan.model_fingerprint = ModelFingerprint(*one_device);
  if (one_device_out) *one_device_out = std::move(one_device);
  return plan;
}
}  // namespace

ParallelPlan MakePlan(nn::LossModule& module, const Tensors& sample_inputs, const Policy& policy,
                      ComputeConfig config) {
  if (config.runtime_ranks == 0) config.runtime_ranks = config.plan_ranks;
  return PlanWithGraph(module, sample_inputs, policy, config, nullptr, /*may_run=*/false);
}

std::unique_ptr<ParallelModule> parallelize(nn::LossModule& module, const Tensors& sample_inputs,
                                            const Policy& policy, const ComputeConfig& config_in) {
  ComputeConfig config = config_in;
  const int world = CurrentWorldSize();
  if (config.runtime_ranks == 0) config.runtime_ranks = world;
  if (config.plan_ranks == 0) config.plan_ranks = config.runtime_ranks;
  TESSEL_CHECK(config.runtime_ranks == world)
      << "parallelize: runtime_ranks=" << config.runtime_ranks << " but the job has " << world << " ranks";
  std::unique_ptr<ir::Graph> one_device;
  ParallelPlan plan = PlanWithGraph(module, sample_inputs, policy, config, &one_device, /*may_run=*/true);
  // A policy that decides differently on different ranks (from timings of
  // its own, say) would have them run different programs.
  CheckLockstep("parallelize's plan", plan.ToText());
  LOG_IF(INFO, CurrentRank() == 0) << "parallelize: " << plan.ToText()
                                   << (config.runtime_ranks > config.plan_ranks
                                           ? "  replicated data-parallel over " +
                                                 std::to_string(config.runtime_ranks / config.plan_ranks) +
                                                 " copies (runtime_ranks " +
                                                 std::to_string(config.runtime_ranks) + ")\n"
                                           : std::string());
  const std::map<std::string, int> first = FirstUseStages(*one_device, plan.op_stage);
  return std::make_unique<ParallelModule>(module, std::move(plan), config, sample_inputs, first);
}

ParallelModule::ParallelModule(nn::LossModule& module, ParallelPlan plan, const ComputeConfig& config,
                               const Tensors& sample_inputs,
                               const std::map<std::string, int>& first_use_stages)
    : module_(module), plan_(std::move(plan)), config_(config) {
  const int64_t replicas = config_.runtime_ranks / config_.plan_ranks;
  stages_ = StagePlacements(plan_, replicas, config_.device_type);
  if (config_.use_zero) {
    // ZeRO's split (dist::ZeroShardSbp) reads the data-parallel size from
    // the dist config; its stage grids are the plan's ([data, tensor],
    // contiguous stages, tensor innermost).
    dist::Setup({.data_parallel_size = plan_.data_parallel * replicas,
                 .tensor_parallel_size = plan_.tensor_parallel,
                 .pipeline_parallel_size = plan_.stages,
                 .pipeline_num_layers = plan_.stages,
                 .device_type = config_.device_type,
                 .zero_stage = 1});
  }
  for (const auto& [name, t] : sample_inputs) {
    input_specs_[name] = ir::Value::SpecOf(t);
    input_stages_[name] = StageOrFirst(first_use_stages, name);
  }
  NoGradGuard no_grad;
  for (auto& [name, p] : module_.NamedParameters()) {
    const Placement& placement = stages_[static_cast<size_t>(StageOrFirst(first_use_stages, name))];
    Tensor laid = FromLocal(*p, placement, Replicated(placement), p->shape())
                      .to_global(placement, ParameterSbp(plan_, replicas, name));
    laid.set_requires_grad(true);
    *p = laid;
  }
}

Tensors ParallelModule::PlaceInputs(const Tensors& batch) const {
  for (const auto& [name, spec] : input_specs_)
    TESSEL_CHECK(batch.count(name)) << "parallelize: the batch has no input '" << name << "' (the sample had "
                                    << input_specs_.size() << " inputs)";
  const int64_t replicas = config_.runtime_ranks / config_.plan_ranks;
  const int64_t rows_split = plan_.data_parallel * replicas * plan_.micro_batches;
  Tensors placed;
  NoGradGuard no_grad;
  for (const auto& [name, t] : batch) {
    auto spec = input_specs_.find(name);
    TESSEL_CHECK(spec != input_specs_.end())
        << "parallelize: the batch has input '" << name << "', which the sample inputs did not";
    TESSEL_CHECK(t.defined() && !t.is_global() && t.shape() == spec->second.shape &&
                 t.dtype() == spec->second.dtype)
        << "parallelize: input '" << name << "' is "
        << (t.defined() ? std::string(DTypeName(t.dtype())) + " " + t.shape().ToString() +
                              (t.is_global() ? " (global)" : "")
                        : std::string("undefined"))
        << "; expected a local " << DTypeName(spec->second.dtype) << " " << spec->second.shape
        << ", as the sample inputs the plan was made for";
    TESSEL_CHECK(t.ndim() >= 1 && t.shape()[0] % rows_split == 0)
        << "parallelize: input '" << name << "' has " << (t.ndim() ? t.shape()[0] : 0) << " rows; "
        << plan_.data_parallel * replicas << " data-parallel ranks x " << plan_.micro_batches
        << " micro-batches need a multiple of " << rows_split;
    const Placement& p = stages_[static_cast<size_t>(input_stages_.at(name))];
    placed[name] = FromLocal(t, p, Replicated(p), t.shape()).to_global(p, InputSbp(plan_, replicas));
  }
  return placed;
}

double ParallelModule::Loss(const Tensors& batch) {
  const Tensors placed = PlaceInputs(batch);
  NoGradGuard no_grad;
  Tensor loss;
  {
    StagePlacer placer(CurrentInterpreter(), stages_);
    InterpreterScope scope(placer);
    loss = module_.Loss(placed);
  }
  return optim::ScalarValue(loss);
}

ParallelModule::StepResult ParallelModule::TrainStep(const Tensors& batch, optim::AdamW& optimizer,
                                                     double max_norm) {
  if (!step_) {
    step_optimizer_ = &optimizer;
    step_max_norm_ = max_norm;
    actors_ = std::make_unique<runtime::ActorRuntime>(runtime::RuntimeOptions{.schedule = config_.schedule});
    GraphOptions options{.micro_batches = plan_.micro_batches, .executor = actors_->Executor()};
    if (plan_.stages > 1)
      for (const Placement& p : stages_) options.stage_ranks.push_back(p.ranks());
    step_ = std::make_unique<Graph>(
        "parallel_train_step",
        [this](const Graph::Tensors& in) -> Graph::Tensors {
          Tensor loss;
          {
            StagePlacer placer(CurrentInterpreter(), stages_);
            InterpreterScope scope(placer);
            loss = module_.Loss(in);
          }
          loss.backward();
          optim::AdamW& adamw = *step_optimizer_;
          Tensor norm =
              optim::ClipGradNormTensor(module_.NamedParameters(), step_max_norm_, adamw.GradientLayouts());
          adamw.Step();
          return {{"loss", loss}, {"grad_norm", norm}};
        },
        options);
  }
  TESSEL_CHECK(&optimizer == step_optimizer_ && max_norm == step_max_norm_)
      << "ParallelModule::TrainStep: the step was captured with another optimizer or max_norm; pass the same "
         "ones at every call";
  const Graph::Tensors out = (*step_)(PlaceInputs(batch));
  const std::vector<double> scalars = optim::ScalarValues({out.at("loss"), out.at("grad_norm")});
  return {scalars[0], scalars[1]};
}

std::unique_ptr<optim::AdamW> build_optimizer(ParallelModule& module, const optim::AdamWConfig& config_in) {
  optim::AdamWConfig config = config_in;
  if (module.config().use_zero) {
    TESSEL_CHECK(config.zero_stage == 0 || config.zero_stage == 1)
        << "build_optimizer: zero_stage " << config.zero_stage
        << " with use_zero; parallelize shards the optimizer state (stage 1) only";
    config.zero_stage = 1;
  }
  return std::make_unique<optim::AdamW>(module.NamedParameters(), config);
}

Tensors merge_state_dicts(ParallelModule& module) {
  const Placement everyone = WorldPlacement(module.stage_placements()[0].device_type());
  NoGradGuard no_grad;
  Tensors whole;
  // Copies: where a parameter is replicated on every rank already, the
  // layout change gives back its own storage.
  for (auto& [name, p] : module.NamedParameters())
    whole[name] = p->to_global(everyone, {B()}).to_local().Clone();
  return whole;
}

void load_merged_state_dict(ParallelModule& module, const Tensors& state) {
  optim::NamedParams params = module.NamedParameters();
  std::set<std::string> names;
  for (auto& [name, p] : params) {
    names.insert(name);
    auto it = state.find(name);
    TESSEL_CHECK(it != state.end()) << "load_merged_state_dict: no entry for parameter '" << name << "'";
    TESSEL_CHECK(it->second.defined() && !it->second.is_global() && it->second.shape() == p->shape() &&
                 it->second.dtype() == p->dtype())
        << "load_merged_state_dict: '" << name << "' is "
        << (it->second.defined()
                ? std::string(DTypeName(it->second.dtype())) + " " + it->second.shape().ToString()
                : std::string("undefined"))
        << "; expected a local " << DTypeName(p->dtype()) << " " << p->shape();
  }
  for (const auto& [name, t] : state)
    TESSEL_CHECK(names.count(name)) << "load_merged_state_dict: '" << name
                                    << "' is no parameter of the model";
  NoGradGuard no_grad;
  for (auto& [name, p] : params) {
    const Tensor& t = state.at(name);
    fn::assign(*p, FromLocal(t, p->placement(), Replicated(p->placement()), t.shape())
                       .to_global(p->placement(), p->nd_sbp()));
  }
}

}  // namespace tessel::parallel
