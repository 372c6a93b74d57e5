#include "layers/regularization.h"

#include "core/error.h"
#include "core/philox.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::layers {

Tensor Dropout::operator()(const Tensor& x) {
  if (!drops()) return x;
  // Three ops, so that graph mode replays them: the offset read as a value
  // (backward and a recomputed forward regenerate the mask from it), the
  // mask, and the counter moved past the draw.
  const Tensor& counter = offset_.TensorBeside(x);
  Tensor y = fn::dropout(x, fn::rng_offset(counter, x), p_, static_cast<int64_t>(seed_));
  fn::rng_advance(counter, x);
  return y;
}

Tensor DropPath::operator()(const Tensor& x) {
  if (!is_training() || p_ == 0) return x;
  TESSEL_CHECK(p_ > 0 && p_ < 1) << "DropPath probability " << p_ << " must be in [0, 1)";
  // The mask is made on the host from a host counter: a captured step
  // would reuse the one it was traced with.
  TESSEL_CHECK(!IsTracing())
      << "DropPath with p=" << p_
      << " makes its masks on the host, so a graph would reuse one mask at every step; "
         "graph mode does not capture it yet: set drop_path_rate to 0 for graph mode, "
         "or train eagerly";
  int64_t& calls = calls_.host();
  const int64_t batch = x.shape()[0];
  std::vector<int64_t> dims(x.ndim(), 1);
  dims[0] = batch;
  std::vector<float> keep(batch);
  Philox gen(seed_);
  for (int64_t b = 0; b < batch; ++b) {
    keep[b] = gen.Uniform(static_cast<uint64_t>(calls * batch + b)) >= p_
                  ? static_cast<float>(1.0 / (1.0 - p_))
                  : 0.0f;
  }
  ++calls;
  Tensor mask = Tensor::FromVector<float>(keep, Shape(dims));
  if (x.is_global()) mask = mask.to_global(x.placement(), NdSbp(std::vector<Sbp>(x.placement().ndim(), B())));
  return fn::mul(x, mask);
}

PatchEmbedding::PatchEmbedding(int64_t in_channels, int64_t hidden, int64_t patch, int64_t layer_idx,
                               uint64_t seed, double init_std)
    : proj(in_channels * patch * patch, hidden,
           {.parallel = Parallel::kData, .layer_idx = layer_idx, .seed = seed, .init_std = init_std}),
      patch_(patch) {
  RegisterModule("proj", proj);
}

Tensor PatchEmbedding::operator()(const Tensor& images) const {
  return proj(fn::patchify(ToHidden(images, proj.weight.placement()), patch_));
}

}  // namespace tessel::layers
