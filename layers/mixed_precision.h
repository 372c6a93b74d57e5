// Mixed-precision training, Megatron-style: the model's parameters become
// bf16 or f16 copies, so forward and backward compute in the low precision;
// f32 master weights take the gradients (cast up and unscaled) and the
// optimizer's updates, and are cast back into the model's parameters after
// each step. f16's narrow range needs a dynamic loss scale: the loss is
// multiplied before backward, the gradients divided after; a step whose
// gradients overflow is skipped and the scale halved, and the scale doubles
// after `growth_interval` clean steps. bf16 has f32's range: its scale is 1.
//
// Eager only (graph mode traces f32 models). The low-precision kernels are
// CUDA's: on the CPU, ops on f16/bf16 tensors are an error that says so.
#pragma once

#include <cstdint>

#include "layers/optimizer.h"

namespace tessel::optim {

struct LossScaleConfig {
  double initial_scale = 65536.0;  // f16 only
  int64_t growth_interval = 1000;  // clean steps before the scale doubles
  double min_scale = 1.0;
};

class MixedPrecision {
 public:
  // Turns `model_params` into `dtype` (f16 or bf16) in place: each pointer
  // then holds a new low-precision leaf; the f32 values become the masters.
  MixedPrecision(NamedParams model_params, DType dtype, LossScaleConfig scale = {});
  DType dtype() const { return dtype_; }
  // The f32 master weights, named like the model's parameters: what the
  // optimizer updates and a checkpoint saves.
  const NamedParams& master_params() { return master_ptrs_; }
  // What backward starts from: loss times the current scale.
  Tensor ScaleLoss(const Tensor& loss) const;
  // Moves the model's gradients to the masters: reduced into each
  // parameter's layout, cast to f32 and divided by the scale; the model's
  // gradients are cleared. Then clips the masters' gradients to global norm
  // `max_norm` as ClipGradNorm does, and returns their norm before clipping.
  // On one GPU (every parameter whole on this rank) the widening and the
  // norm are two launches for all parameters instead of four small ops per
  // parameter (ops/cuda/multi_tensor.h); elsewhere, ops.
  double UnscaleAndClip(double max_norm);
  // With the norm UnscaleAndClip returned: false when it is
  // not finite (the gradients overflowed): the masters' gradients are
  // dropped and the scale halved, and the caller skips the update. True
  // otherwise (every growth_interval-th such step doubles the scale).
  bool StepIsFinite(double grad_norm);
  // After the optimizer's update: the model's parameters = the masters,
  // cast down (in place, so every handle to them sees the new values).
  void CopyMastersToModel();
  double loss_scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }

 private:
  NamedParams model_;
  std::vector<Tensor> masters_;
  NamedParams master_ptrs_;
  DType dtype_;
  LossScaleConfig config_;
  // Whether every parameter (and, with_grads, its gradient) is a whole
  // CUDA tensor on this rank, so the multi-tensor kernels can do the step's
  // casts and norm.
  bool WholeOnGpu(bool with_grads) const;

  double scale_;
  int64_t clean_steps_ = 0, skipped_ = 0;
};

}  // namespace tessel::optim
