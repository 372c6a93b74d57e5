// rotary: rotary position embeddings of x [batch, seq, heads, head_dim] at
// positions [batch, seq] or [seq] (ops/cpu/rotary.h). Attributes: theta
// (the base of the frequencies), inverse (rotate back: the gradient), and
// optionally Llama 3's frequency scaling: scaling_factor (> 0 turns it on),
// low_freq_factor, high_freq_factor, original_max_positions.
#include "ops/cpu/rotary.h"

#include <cmath>
#include <numbers>

#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/rotary.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

namespace {
// inv_freq[j] = theta^(-2j/d) in f32, as Hugging Face computes it, then
// Llama 3's scaling: long wavelengths divided by the factor, short ones
// kept, the band between blended.
std::vector<float> InverseFrequencies(int64_t head_dim, const Attrs& a) {
  const float theta = static_cast<float>(a.Get<double>("theta"));
  std::vector<float> inv(head_dim / 2);
  for (int64_t j = 0; j < head_dim / 2; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    inv[j] = 1.0f / static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(exponent)));
  }
  const double factor = a.Has("scaling_factor") ? a.Get<double>("scaling_factor") : 0.0;
  if (factor <= 0) return inv;
  const double low = a.Get<double>("low_freq_factor"), high = a.Get<double>("high_freq_factor");
  const double context = static_cast<double>(a.Get<int64_t>("original_max_positions"));
  const double low_wavelen = context / low, high_wavelen = context / high;
  for (float& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / factor);
    } else {
      const double smooth = (context / wavelen - low) / (high - low);
      f = static_cast<float>((1 - smooth) * f / factor + smooth * f);
    }
  }
  return inv;
}
}  // namespace

void RegisterRotaryOps() {
  OpDef def;
  def.name = "rotary";
  def.inputs = {"x", "positions"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    defs::CheckFloat("rotary", in[0], "x");
    const Shape& x = in[0].shape;
    TESSEL_CHECK(x.ndim() == 4 && x[3] % 2 == 0)
        << "rotary: x must be [batch, seq, heads, head_dim] with an even head_dim; got " << x;
    const Shape& p = in[1].shape;
    TESSEL_CHECK(in[1].dtype == DType::kInt64 && (p == Shape{x[1]} || p == Shape{x[0], x[1]}))
        << "rotary: positions must be i64 [seq] or [batch, seq] for x " << x << "; got " << in[1].dtype << " "
        << p;
    const double factor = a.Has("scaling_factor") ? a.Get<double>("scaling_factor") : 0.0;
    TESSEL_CHECK(a.Get<double>("theta") > 0) << "rotary: theta must be > 0; got " << a.Get<double>("theta");
    if (factor > 0)
      TESSEL_CHECK(a.Get<double>("high_freq_factor") > a.Get<double>("low_freq_factor") &&
                   a.Get<double>("low_freq_factor") > 0 && a.Get<int64_t>("original_max_positions") > 0)
          << "rotary: Llama 3 scaling needs high_freq_factor > low_freq_factor > 0 and "
             "original_max_positions > 0; got "
          << a.ToString();
    return std::vector<TensorSpec>{in[0]};
  };
  // Split with x on batch or sequence (positions alike), or on heads
  // (positions whole); linear in x.
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    const bool per_row = in[1].shape.ndim() == 2;
    std::vector<SbpSignature> out = {{{S(0), per_row ? S(0) : B()}, {S(0)}},
                                     {{S(1), per_row ? S(1) : S(0)}, {S(1)}},
                                     {{S(2), B()}, {S(2)}},
                                     {{P(), B()}, {P()}}};
    return out;
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const Tensor& x = ctx.inputs[0];
    return std::vector<Tensor>{cpu::Rotary(x, ctx.inputs[1], InverseFrequencies(x.shape()[3], ctx.attrs),
                                           ctx.attrs.Get<bool>("inverse"))};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const Tensor& x = ctx.inputs[0];
    return std::vector<Tensor>{cuda::Rotary(x, ctx.inputs[1], InverseFrequencies(x.shape()[3], ctx.attrs),
                                            ctx.attrs.Get<bool>("inverse"))};
  };
#endif
  // A rotation's gradient is the rotation back; it reads only the positions.
  def.saved = OpDef::SavedForGrad{{1}, {}};
  def.grad = [](const GradContext& c) {
    Attrs back = c.attrs;
    back.Set("inverse", !c.attrs.Get<bool>("inverse"));
    return std::vector<Tensor>{ApplyOp("rotary", {c.grad_outputs[0], c.inputs[1]}, back).at(0), Tensor()};
  };
  RegisterOp(std::move(def));
}

}  // namespace tessel
