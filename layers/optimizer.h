// Optimizers over a module's named parameters, and learning-rate schedules.
// Weight decay skips biases and 1-D parameters (norm gains and shifts), as
// Megatron does. A gradient that is not in its parameter's layout (partial
// sums under data parallelism) is reduced into it once, by clipping or the
// update, and parameters and optimizer state keep their layouts. Updates are
// in place: a parameter is a variable whose storage (and any handle to it)
// changes, never replaced by a new tensor, and so are the optimizer states.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "sbp/sbp.h"

namespace tessel::optim {

using NamedParams = std::vector<std::pair<std::string, Tensor*>>;

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  // ZeRO (dist::Config::zero_stage, which must agree): with 1 or 2 the
  // moments of each parameter replicated over dp are split over dp
  // (dist::ZeroShardSbp); each step reduce-scatters the gradient into that
  // layout, updates an f32 shard of the parameter (a variable, refreshed
  // from the parameter before every update) and all-gathers it back into
  // the parameter. With 3 the parameters are split already and the
  // moments follow them. 0: off.
  int64_t zero_stage = 0;
};

// Capturable: the learning rate and each parameter's step count are
// tensors (as in PyTorch's capturable optimizers), so Step() called while a
// graph traces records an update that reads the current learning rate and
// counts steps at every call of the graph.
class AdamW {
 public:
  AdamW(NamedParams params, AdamWConfig config);
  // Updates every parameter that has a gradient, then clears the gradients.
  void Step();
  // Writes the learning rate into its tensors in place (eager and captured
  // steps both read them).
  void set_lr(double lr);
  double lr() const { return config_.lr; }
  // The state, each in its parameter's layout (its ZeRO shard's under
  // stages 1 and 2), named after the parameter: "<name>.exp_avg",
  // "<name>.exp_avg_sq", "<name>.step" (what a checkpoint saves and loads in
  // place; a ZeRO shard of the parameter is not state: it is refreshed from
  // the parameter at every step).
  NamedParams NamedState();
  // The layout each parameter's gradient is reduced into before clipping
  // and the update (in the order of the parameters; empty for a local one):
  // the parameter's own, or its ZeRO shard's. Pass it to ClipGradNorm.
  std::vector<NdSbp> GradientLayouts() const;
  // Bytes of this rank's shards of the optimizer's tensors: the moments, the
  // step counts and, under ZeRO 1/2, the f32 shards of the parameters.
  int64_t LocalStateBytes() const;

 private:
  // The learning-rate scalar on param's placement (made if new).
  Tensor LrBeside(const Tensor& param);
  // Every parameter whole on one GPU (one rank, no ZeRO shards): the whole
  // step in two launches (ops/cuda/multi_tensor.h). False, having changed
  // nothing, where that does not hold.
  bool StepOnOneGpu();

  NamedParams params_;
  AdamWConfig config_;
  std::vector<NdSbp> grad_layouts_;
  // ZeRO 1/2: the f32 shard each update writes (undefined: the parameter itself).
  std::vector<Tensor> shards_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_, step_;
  std::vector<Tensor> lr_;  // one f32 scalar per placement (and one local)
};

class SGD {
 public:
  SGD(NamedParams params, double lr, double momentum = 0.0, double weight_decay = 0.0);
  void Step();
  void set_lr(double lr) { lr_ = lr; }

 private:
  NamedParams params_;
  double lr_, momentum_, weight_decay_;
  std::vector<Tensor> buffers_;
  bool first_ = true;
};

// The parameter's gradient in the parameter's own layout, or in `layout`
// (a ZeRO shard's) when given: a partial gradient (data parallel, or a
// replicated weight used by split compute) is reduced here, once per step,
// and kept reduced (set_grad), so that gradient handlers, clipping and the
// update see the same tensor and the parameter keeps its layout.
Tensor ReducedGrad(Tensor* param, const NdSbp* layout = nullptr);

// Scales every gradient by min(1, max_norm / (total_norm + 1e-6)); returns
// the norm. Collective over the world (every rank gets the norm). Each
// gradient is first reduced into grad_layouts[i] (AdamW::GradientLayouts:
// a ZeRO shard's layout) or, when none is given, into its parameter's.
double ClipGradNorm(const NamedParams& params, double max_norm, const std::vector<NdSbp>& grad_layouts = {});
// The same with ops only, no value read on the host, so it can be captured
// in a graph: returns the norm as a scalar tensor (undefined if no
// parameter has a gradient).
Tensor ClipGradNormTensor(const NamedParams& params, double max_norm,
                          const std::vector<NdSbp>& grad_layouts = {});

// Linear warmup to base_lr over warmup_steps, then cosine (or linear) decay
// to min_lr at total_steps.
double WarmupCosineLr(int64_t step, double base_lr, int64_t warmup_steps, int64_t total_steps,
                      double min_lr = 0);
double WarmupLinearLr(int64_t step, double base_lr, int64_t warmup_steps, int64_t total_steps,
                      double min_lr = 0);

// The value of a one-element tensor (local or global, any SBP) on every rank,
// including ranks outside its placement. Collective over the world (a
// global tensor's); a local tensor is this rank's own value.
double ScalarValue(const Tensor& t);

// ScalarValue of each of `scalars`, with one world-wide all-reduce for all
// of them (none on one rank, or with only local tensors): the ranks of a
// global scalar's placement add their parts (every rank along a partial-sum
// axis, the first along a broadcast one), in single precision as the tensors are. `summed`,
// when given, is added over the ranks in the same all-reduce (numbers every
// rank must agree on, such as a stop request) and holds the sums after.
std::vector<double> ScalarValues(const std::vector<Tensor>& scalars, std::vector<double>* summed = nullptr);

// True for a tensor on a GPU that this rank holds whole (local, or global on
// a placement of one rank): where the multi-tensor kernels may take it.
bool WholeOnOneGpu(const Tensor& t);

#ifdef TESSEL_HAS_CUDA
// ClipGradNorm on local gradients of one GPU, in two launches: dst[i] =
// src[i] * unscale (f32; src and dst may be the same tensors), then dst
// scaled by min(1, max_norm / (norm + 1e-6)) unless the norm is not finite.
// Returns the norm of the unscaled gradients.
double UnscaleAndClipOnOneGpu(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, double unscale,
                              double max_norm);
#endif

}  // namespace tessel::optim
