#include "layers/mixed_precision.h"

#include <cmath>

#include "core/error.h"
#include "graph/autograd.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/multi_tensor.h"
#endif

namespace tessel::optim {

MixedPrecision::MixedPrecision(NamedParams model_params, DType dtype, LossScaleConfig scale)
    : model_(std::move(model_params)),
      dtype_(dtype),
      config_(scale),
      scale_(dtype == DType::kFloat16 ? scale.initial_scale : 1.0) {
  TESSEL_CHECK(dtype == DType::kFloat16 || dtype == DType::kBFloat16)
      << "mixed precision computes in f16 or bf16, not " << dtype;
  TESSEL_CHECK(scale_ >= config_.min_scale && config_.min_scale > 0 && config_.growth_interval > 0)
      << "loss scale: initial " << scale_ << ", minimum " << config_.min_scale << ", growth interval "
      << config_.growth_interval << "; expected initial >= minimum > 0 and a positive interval";
  NoGradGuard no_grad;
  masters_.reserve(model_.size());  // master_ptrs_ points into it
  for (auto& [name, p] : model_) {
    TESSEL_CHECK(p->dtype() == DType::kFloat32)
        << "mixed precision: parameter '" << name << "' is " << p->dtype() << "; expected the f32 model";
    masters_.push_back(p->detach());
    masters_.back().set_requires_grad(true);  // a leaf: it holds the f32 gradient
    Tensor low = fn::cast(masters_.back(), dtype_).detach();
    low.set_requires_grad(true);
    *p = low;
  }
  for (size_t i = 0; i < model_.size(); ++i) master_ptrs_.emplace_back(model_[i].first, &masters_[i]);
}

Tensor MixedPrecision::ScaleLoss(const Tensor& loss) const {
  return scale_ == 1.0 ? loss : fn::mul_scalar(loss, scale_);
}

bool MixedPrecision::WholeOnGpu(bool with_grads) const {
#ifdef TESSEL_HAS_CUDA
  for (const auto& [name, p] : model_)
    if (!WholeOnOneGpu(*p) || (with_grads && !WholeOnOneGpu(p->grad()))) return false;
  return !model_.empty();
#else
  return false;
#endif
}

double MixedPrecision::UnscaleAndClip(double max_norm) {
  NoGradGuard no_grad;
#ifdef TESSEL_HAS_CUDA
  if (WholeOnGpu(/*with_grads=*/true)) {
    std::vector<Tensor> low, wide;
    for (size_t i = 0; i < model_.size(); ++i) {
      Tensor* p = model_[i].second;
      low.push_back(p->grad().to_local());
      Tensor w = Tensor::Empty(masters_[i].to_local().shape(), DType::kFloat32, low.back().device());
      wide.push_back(w);
      masters_[i].set_grad(masters_[i].is_global() ? MakeGlobal(w, masters_[i].shape(),
                                                                masters_[i].placement(), masters_[i].nd_sbp())
                                                   : w);
      p->zero_grad();
    }
    return UnscaleAndClipOnOneGpu(low, wide, 1.0 / scale_, max_norm);
  }
#endif
  for (size_t i = 0; i < model_.size(); ++i) {
    Tensor* p = model_[i].second;
    Tensor g = p->grad();
    if (!g.defined()) continue;
    // Reduced in the low precision (half the bytes to move), then widened.
    if (g.is_global() && (g.placement() != p->placement() || g.nd_sbp() != p->nd_sbp()))
      g = g.to_global(p->placement(), p->nd_sbp());
    Tensor wide = fn::cast(g, DType::kFloat32);
    if (scale_ != 1.0) wide = fn::mul_scalar(wide, 1.0 / scale_);
    masters_[i].set_grad(wide);
    p->zero_grad();
  }
  return ClipGradNorm(master_ptrs_, max_norm);
}

bool MixedPrecision::StepIsFinite(double grad_norm) {
  if (std::isfinite(grad_norm)) {
    if (dtype_ == DType::kFloat16 && ++clean_steps_ % config_.growth_interval == 0) scale_ *= 2;
    return true;
  }
  ++skipped_;
  clean_steps_ = 0;
  scale_ = std::max(config_.min_scale, scale_ / 2);
  for (Tensor& m : masters_) m.zero_grad();
  return false;
}

void MixedPrecision::CopyMastersToModel() {
  NoGradGuard no_grad;
#ifdef TESSEL_HAS_CUDA
  if (WholeOnGpu(/*with_grads=*/false)) {
    std::vector<Tensor> src, dst;
    for (size_t i = 0; i < model_.size(); ++i) {
      src.push_back(masters_[i].to_local());
      dst.push_back(model_[i].second->to_local());
    }
    cuda::CastInto(src, dst);
    return;
  }
#endif
  for (size_t i = 0; i < model_.size(); ++i) {
    const Tensor low = fn::cast(masters_[i], dtype_);
    Tensor dst = model_[i].second->to_local();
    dst.CopyFrom(low.to_local());
  }
}

}  // namespace tessel::optim
