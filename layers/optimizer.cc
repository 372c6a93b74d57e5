#include "layers/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/comm/process_group.h"
#include "core/error.h"
#include "graph/autograd.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "sbp/sbp.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/multi_tensor.h"
#include "ops/interpreter.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::optim {

namespace {
// Megatron's rule: biases and 1-D parameters (norm gains and shifts) are not
// decayed; names are not searched for substrings, so a weight whose name
// happens to contain "ln" is still decayed.
bool Decays(const std::string& name, const Tensor& param) {
  const std::string suffix = "bias";
  const bool is_bias =
      name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return !is_bias && param.ndim() >= 2;
}

}  // namespace

Tensor ReducedGrad(Tensor* param, const NdSbp* layout) {
  Tensor g = param->grad();
  if (!g.defined() || !g.is_global() || !param->is_global()) return g;
  const NdSbp& want = layout != nullptr ? *layout : param->nd_sbp();
  if (g.placement() == param->placement() && g.nd_sbp() == want) return g;
  g = g.to_global(param->placement(), want);
  param->set_grad(g);
  return g;
}

namespace {

// Updates are in place, so two parameters on one memory would be updated
// twice (a tied weight must be listed once).
void CheckDistinct(const NamedParams& params) {
  std::vector<std::pair<const char*, size_t>> spans;  // (start, index)
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].second->is_lazy()) continue;  // built for planning (graph/ir/meta.h): no memory to share
    const Tensor local = params[i].second->to_local();
    if (local.raw_data() != nullptr && local.nbytes() > 0)
      spans.push_back({static_cast<const char*>(local.raw_data()), i});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    const size_t prev = spans[k - 1].second, cur = spans[k].second;
    TESSEL_CHECK(spans[k - 1].first + params[prev].second->to_local().nbytes() <= spans[k].first)
        << "parameters '" << params[prev].first << "' and '" << params[cur].first
        << "' share memory; optimizers update in place, so list a tied parameter once";
  }
}

Tensor ZerosLike(const Tensor& t) {
  NoGradGuard no_grad;
  return fn::mul_scalar(t.detach(), 0.0);
}
}  // namespace

namespace {
double LocalValue(const Tensor& local) {
  Tensor v = local.To(Device::CPU());
  if (v.dtype() != DType::kFloat32) v = fn::cast(v, DType::kFloat32);
  return static_cast<double>(v.data<float>()[0]);
}
}  // namespace

double ScalarValue(const Tensor& t) { return ScalarValues({t})[0]; }

std::vector<double> ScalarValues(const std::vector<Tensor>& scalars, std::vector<double>* summed) {
  NoGradGuard no_grad;
  const int rank = CurrentRank();
  std::vector<double> values;
  std::vector<char> global;
  for (const Tensor& t : scalars) {
    TESSEL_CHECK(t.numel() == 1) << "ScalarValue of a tensor of shape " << t.shape();
    Tensor v = t.detach();
    global.push_back(v.is_global());
    if (!v.is_global()) {
      values.push_back(LocalValue(v));
      continue;
    }
    const Placement p = v.placement();
    auto all = [&](auto predicate) {
      return std::all_of(v.nd_sbp().sbps().begin(), v.nd_sbp().sbps().end(), predicate);
    };
    // A maximum, which a sum cannot combine, is made whole on its placement
    // first (a collective of its ranks).
    if (!all([](const Sbp& s) { return s.type() != SbpType::kPartialMax; }))
      v = v.to_global(p, NdSbp(std::vector<Sbp>(p.ndim(), B())));
    if (p.size() == CurrentWorldSize() && all([](const Sbp& s) { return s.is_broadcast(); })) {
      global.back() = 0;  // every rank holds it whole: nothing to exchange
      values.push_back(LocalValue(v.to_local()));
      continue;
    }
    // This rank's part: its shard along partial-sum axes, the first rank's
    // along broadcast ones (a one-element tensor has no split).
    const int index = p.IndexOf(rank);
    bool contributes = index >= 0;
    if (contributes) {
      const std::vector<int64_t> coord = p.Coord(index);
      for (int axis = 0; axis < p.ndim(); ++axis) {
        const Sbp& sbp = v.nd_sbp()[static_cast<size_t>(axis)];
        TESSEL_CHECK(!sbp.is_split()) << "ScalarValue of a one-element tensor split over axis " << axis;
        if (sbp.is_broadcast() && coord[static_cast<size_t>(axis)] != 0) contributes = false;
      }
    }
    values.push_back(contributes ? LocalValue(v.to_local()) : 0.0);
  }
  const bool any_global = std::find(global.begin(), global.end(), 1) != global.end();
  if (CurrentWorldSize() > 1 && (any_global || (summed && !summed->empty()))) {
    // The parts are f32 values: summed as f32, as the layout change to a
    // replicated scalar would.
    std::vector<float> buffer;
    for (size_t i = 0; i < values.size(); ++i)
      if (global[i]) buffer.push_back(static_cast<float>(values[i]));
    if (summed)
      for (double x : *summed) buffer.push_back(static_cast<float>(x));
    comm::World().AllReduce(buffer.data(), static_cast<int64_t>(buffer.size()), DType::kFloat32,
                            comm::ReduceOp::kSum);
    size_t k = 0;
    for (size_t i = 0; i < values.size(); ++i)
      if (global[i]) values[i] = static_cast<double>(buffer[k++]);
    if (summed)
      for (double& x : *summed) x = static_cast<double>(buffer[k++]);
  }
  return values;
}

bool WholeOnOneGpu(const Tensor& t) {
  return t.defined() && !t.is_lazy() && t.device().is_cuda() && (!t.is_global() || t.placement().size() == 1);
}

AdamW::AdamW(NamedParams params, AdamWConfig config) : params_(std::move(params)), config_(config) {
  CheckDistinct(params_);
  TESSEL_CHECK(config_.zero_stage >= 0 && config_.zero_stage <= 3)
      << "AdamW: zero_stage " << config_.zero_stage << "; expected 0 (off), 1, 2 or 3";
  TESSEL_CHECK(config_.zero_stage == 0 || config_.zero_stage == dist::GetConfig().zero_stage)
      << "AdamW: zero_stage " << config_.zero_stage << " but dist::Setup's is "
      << dist::GetConfig().zero_stage << "; the layers and the optimizer must agree";
  for (auto& [name, p] : params_) {
    NdSbp layout = p->is_global() ? p->nd_sbp() : NdSbp();
    Tensor shard;  // the tensor the update writes, when not the parameter
    if (p->is_global() && (config_.zero_stage == 1 || config_.zero_stage == 2)) {
      const NdSbp split = dist::ZeroShardSbp(p->shape(), layout);
      if (split != layout) {
        NoGradGuard no_grad;
        layout = split;
        shard = ZerosLike(p->detach().to_global(p->placement(), split));  // storage of its own
      }
    }
    const Tensor& like = shard.defined() ? shard : *p;
    grad_layouts_.push_back(layout);
    shards_.push_back(shard);
    exp_avg_.push_back(ZerosLike(like));
    exp_avg_sq_.push_back(ZerosLike(like));
    step_.push_back(ReplicatedScalar(0, *p, DType::kInt64));
    LrBeside(*p);  // made now, so set_lr reaches every placement before the first Step
  }
}

std::vector<NdSbp> AdamW::GradientLayouts() const { return grad_layouts_; }

int64_t AdamW::LocalStateBytes() const {
  int64_t bytes = 0;
  for (const std::vector<Tensor>* list : {&shards_, &exp_avg_, &exp_avg_sq_, &step_})
    for (const Tensor& t : *list)
      if (t.defined() && !t.is_lazy()) bytes += static_cast<int64_t>(t.to_local().nbytes());
  return bytes;
}

NamedParams AdamW::NamedState() {
  NamedParams state;
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].first;
    state.emplace_back(name + ".exp_avg", &exp_avg_[i]);
    state.emplace_back(name + ".exp_avg_sq", &exp_avg_sq_[i]);
    state.emplace_back(name + ".step", &step_[i]);
  }
  return state;
}

Tensor AdamW::LrBeside(const Tensor& param) {
  for (const Tensor& lr : lr_) {
    if (lr.is_global() == param.is_global() && (!lr.is_global() || lr.placement() == param.placement()))
      return lr;
  }
  lr_.push_back(ReplicatedScalar(config_.lr, param, DType::kFloat32));
  return lr_.back();
}

void AdamW::set_lr(double lr) {
  config_.lr = lr;
  for (const Tensor& t : lr_) {
    // Ranks outside a placement hold no value of it.
    if (t.is_global() && !t.placement().Contains(CurrentRank())) continue;
    Tensor local = t.to_local();  // on the placement's device: written by a copy
    local.CopyFrom(Tensor::FromVector<float>({static_cast<float>(lr)}, local.shape()));
  }
}

bool AdamW::StepOnOneGpu() {
#ifdef TESSEL_HAS_CUDA
  if (IsTracing() || params_.empty()) return false;
  Tensor lr;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = *params_[i].second;
    if (shards_[i].defined() || !WholeOnOneGpu(p) || p.dtype() != DType::kFloat32) return false;
    const Tensor& g = p.grad();
    if (g.defined() && (!WholeOnOneGpu(g) || g.dtype() != DType::kFloat32)) return false;
    const Tensor l = LrBeside(p).to_local();
    if (!lr.defined()) lr = l;
    if (l.raw_data() != lr.raw_data()) return false;  // two placements: two learning-rate tensors
  }
  cuda::AdamWGroup group;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor* p = params_[i].second;
    Tensor g = ReducedGrad(p, p->is_global() ? &grad_layouts_[i] : nullptr);  // one rank: nothing moves
    if (!g.defined()) continue;
    group.params.push_back(p->to_local());
    group.grads.push_back(g.to_local());
    group.exp_avgs.push_back(exp_avg_[i].to_local());
    group.exp_avg_sqs.push_back(exp_avg_sq_[i].to_local());
    group.steps.push_back(step_[i].to_local());
    group.weight_decays.push_back(Decays(params_[i].first, *p) ? config_.weight_decay : 0.0);
  }
  cuda::AdamWStep(group, lr, config_.beta1, config_.beta2, config_.eps);
  for (auto& [name, p] : params_) p->zero_grad();
  return true;
#else
  return false;
#endif
}

void AdamW::Step() {
  NoGradGuard no_grad;
  if (StepOnOneGpu()) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor* p = params_[i].second;
    Tensor g = ReducedGrad(p, p->is_global() ? &grad_layouts_[i] : nullptr);
    if (!g.defined()) continue;
    fn::AdamWOptions o{config_.beta1, config_.beta2, config_.eps,
                       Decays(params_[i].first, *p) ? config_.weight_decay : 0.0};
    // In place: the parameter (through a detached handle on its storage)
    // and its states keep their identity, as graph variables must. Under
    // ZeRO 1/2 the shard takes this rank's part of the parameter (a local
    // slice), is updated, and is gathered back into the parameter.
    const Tensor& target = shards_[i].defined() ? shards_[i] : *p;
    if (shards_[i].defined()) fn::assign(shards_[i], p->detach());
    fn::adamw_update(target.detach(), g, exp_avg_[i], exp_avg_sq_[i], step_[i], LrBeside(*p), o);
    if (shards_[i].defined()) fn::assign(p->detach(), shards_[i]);
    p->zero_grad();
  }
}

SGD::SGD(NamedParams params, double lr, double momentum, double weight_decay)
    : params_(std::move(params)), lr_(lr), momentum_(momentum), weight_decay_(weight_decay) {
  CheckDistinct(params_);
  for (auto& [name, p] : params_) buffers_.push_back(ZerosLike(*p));
}

void SGD::Step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor* p = params_[i].second;
    Tensor g = ReducedGrad(p);
    if (!g.defined()) continue;
    fn::sgd_update(p->detach(), g, buffers_[i], lr_, momentum_,
                   Decays(params_[i].first, *p) ? weight_decay_ : 0.0,
                   first_);  // in place, as AdamW
    p->zero_grad();
  }
  first_ = false;
}

Tensor ClipGradNormTensor(const NamedParams& params, double max_norm,
                          const std::vector<NdSbp>& grad_layouts) {
  NoGradGuard no_grad;
  TESSEL_CHECK(grad_layouts.empty() || grad_layouts.size() == params.size())
      << "ClipGradNorm: " << grad_layouts.size() << " gradient layouts for " << params.size()
      << " parameters; expected one each (AdamW::GradientLayouts) or none";
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor* p = params[i].second;
    const bool given = !grad_layouts.empty() && p->is_global();
    Tensor g = ReducedGrad(p, given ? &grad_layouts[i] : nullptr);
    if (g.defined()) grads.push_back(g);
  }
  if (grads.empty()) return Tensor();
  const Tensor norm = fn::global_norm(grads);
  const Tensor coef = fn::div(ReplicatedScalar(max_norm, norm, DType::kFloat32), fn::add_scalar(norm, 1e-6));
  // min(1, coef) as 1 - relu(1 - coef): exactly 1 when not clipping, so
  // unclipped gradients are unchanged bit for bit.
  const Tensor scale = fn::add_scalar(fn::neg(fn::relu(fn::add_scalar(fn::neg(coef), 1.0))), 1.0);
  std::vector<Tensor> scale_by_placement;  // the scale moved beside each gradient, once per placement
  for (auto& [name, p] : params) {
    const Tensor g = p->grad();
    if (!g.defined()) continue;
    Tensor s = scale;
    if (g.is_global() && scale.is_global() && g.placement() != scale.placement()) {
      auto it = std::find_if(scale_by_placement.begin(), scale_by_placement.end(),
                             [&](const Tensor& t) { return t.placement() == g.placement(); });
      if (it == scale_by_placement.end()) {
        scale_by_placement.push_back(
            scale.to_global(g.placement(), NdSbp(std::vector<Sbp>(g.placement().ndim(), B()))));
        it = scale_by_placement.end() - 1;
      }
      s = *it;
    }
    p->set_grad(fn::mul(g, s));
  }
  return norm;
}

#ifdef TESSEL_HAS_CUDA
double UnscaleAndClipOnOneGpu(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, double unscale,
                              double max_norm) {
  const double norm = ScalarValue(cuda::UnscaleAndNorm(src, dst, unscale));
  const double coef = max_norm / (norm + 1e-6);                           // ClipGradNormTensor's rule
  if (coef < 1.0 && std::isfinite(norm)) cuda::CastInto(dst, dst, coef);  // in place
  return norm;
}
#endif

double ClipGradNorm(const NamedParams& params, double max_norm, const std::vector<NdSbp>& grad_layouts) {
#ifdef TESSEL_HAS_CUDA
  // Every gradient whole on one GPU: the norm in one launch and the clip in
  // another, instead of three ops per parameter.
  const bool one_gpu = !IsTracing() && std::all_of(params.begin(), params.end(), [](const auto& named) {
    const Tensor& g = named.second->grad();
    return !g.defined() || (WholeOnOneGpu(g) && g.dtype() == DType::kFloat32);
  });
  if (one_gpu) {
    NoGradGuard no_grad;
    std::vector<Tensor> grads;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor* p = params[i].second;
      const bool given = !grad_layouts.empty() && p->is_global();
      const Tensor g = ReducedGrad(p, given ? &grad_layouts[i] : nullptr);  // one rank: nothing moves
      if (g.defined()) grads.push_back(g.to_local());
    }
    return grads.empty() ? 0.0 : UnscaleAndClipOnOneGpu(grads, grads, 1.0, max_norm);
  }
#endif
  const Tensor norm = ClipGradNormTensor(params, max_norm, grad_layouts);
  return norm.defined() ? ScalarValue(norm) : 0.0;
}

double WarmupCosineLr(int64_t step, double base_lr, int64_t warmup, int64_t total, double min_lr) {
  if (step < warmup) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double t = std::min(1.0, static_cast<double>(step - warmup) / std::max<double>(1.0, total - warmup));
  return min_lr + (base_lr - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * t));
}

double WarmupLinearLr(int64_t step, double base_lr, int64_t warmup, int64_t total, double min_lr) {
  if (step < warmup) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double t = std::min(1.0, static_cast<double>(step - warmup) / std::max<double>(1.0, total - warmup));
  return base_lr + (min_lr - base_lr) * t;
}

}  // namespace tessel::optim
