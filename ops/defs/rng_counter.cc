// Random-stream counters as tensors: rng_offset (where the stream stands,
// as a value) and rng_advance (move it on, in place). A layer that draws
// random masks keeps its counter in an i64 scalar tensor (layers/
// regularization.h: Dropout), so a captured training step — where the
// counter is a variable the graph holds — draws new masks at every call, as
// eager code does, instead of replaying the ones it was traced with.
//
// Both take the tensor the draw is for (`like`): its logical element count
// is how far the stream moves, and reading it places the ops among that
// tensor's (the compiler copies them with each micro-batch's forward). Its
// data is not read, and any layout of it is taken as it is (no boxing).
#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/nn_kernels.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

void CheckCounter(const std::string& op, const TensorSpec& counter) {
  TESSEL_CHECK(counter.shape.ndim() == 0 && counter.dtype == DType::kInt64)
      << op << ": the counter must be an i64 scalar; got " << counter.dtype << " " << counter.shape;
}

// The counter replicated; `like` in whatever layout it has.
std::vector<SbpSignature> CounterBesideAnyLayout(const std::vector<TensorSpec>& in, const Attrs&) {
  std::vector<SbpSignature> sigs;
  for (int d = 0; d < in[1].shape.ndim(); ++d) sigs.push_back({{B(), S(d)}, {B()}});
  sigs.push_back({{B(), P()}, {B()}});
  return sigs;
}

Tensor CopyOf(const Tensor& counter) {
  Tensor out = Tensor::Empty(counter.shape(), counter.dtype(), counter.device());
  out.CopyFrom(counter);  // on the counter's device: no host round trip
  return out;
}

}  // namespace

void RegisterRngCounterOps() {
  {
    OpDef def;
    def.name = "rng_offset";
    def.not_differentiable = true;  // an i64 position
    def.inputs = {"counter", "like"};
    def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
      CheckCounter("rng_offset", in[0]);
      return std::vector<TensorSpec>{in[0]};
    };
    def.sbp = CounterBesideAnyLayout;
    auto kernel = [](const KernelContext& ctx) { return std::vector<Tensor>{CopyOf(ctx.inputs[0])}; };
    def.kernels[DeviceType::kCPU] = kernel;
#ifdef TESSEL_HAS_CUDA
    def.kernels[DeviceType::kCUDA] = kernel;
#endif
    RegisterOp(std::move(def));
  }
  {
    OpDef def;
    def.name = "rng_advance";
    def.inputs = {"counter", "like"};
    def.mutates = {0};
    def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
      CheckCounter("rng_advance", in[0]);
      return std::vector<TensorSpec>{in[0]};
    };
    def.sbp = CounterBesideAnyLayout;
    def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
      ctx.inputs[0].data<int64_t>()[0] += ctx.logical_inputs[1].shape.numel();
      return std::vector<Tensor>{ctx.inputs[0]};
    };
#ifdef TESSEL_HAS_CUDA
    def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
      cuda::AdvanceCounter(ctx.inputs[0], ctx.logical_inputs[1].shape.numel());
      return std::vector<Tensor>{ctx.inputs[0]};
    };
#endif
    RegisterOp(std::move(def));
  }
}

}  // namespace tessel
