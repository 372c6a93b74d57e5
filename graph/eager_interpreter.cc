// The eager interpreter: runs each functional op at once. Global inputs are
// boxed to the inferred signature and the kernel runs on this rank's shards.
// Autograd is a layer over it (graph/autograd.cc).
#include "graph/eager_interpreter.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/boxing_executor.h"
#include "graph/sbp_inference.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#ifdef TESSEL_HAS_CUDA
#include "core/cuda/cuda_runtime.h"
#endif

namespace tessel {
namespace {

std::string Describe(const OpDef& op, const std::vector<Tensor>& inputs) {
  std::ostringstream os;
  for (size_t i = 0; i < inputs.size(); ++i) {
    os << (i ? ", " : "") << op.input_name(i) << " ";
    if (!inputs[i].defined()) {
      os << "(undefined)";
      continue;
    }
    os << inputs[i].dtype() << " " << inputs[i].shape();
    if (inputs[i].is_global()) os << " " << inputs[i].nd_sbp() << " on " << inputs[i].placement();
  }
  return os.str();
}

// The CPU kernels compute in f32 (data movement and casts take any dtype):
// an f16/bf16 input that reaches one they cannot take gets this reason
// added to the kernel's own error.
std::vector<Tensor> RunKernel(const OpDef& op, DeviceType device, const Kernel& kernel,
                              const KernelContext& ctx) {
  if (device != DeviceType::kCPU) return kernel(ctx);
  try {
    return kernel(ctx);
  } catch (const Error& e) {
    for (const Tensor& t : ctx.inputs) {
      if (t.defined() && (t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16)) {
        TESSEL_THROW(e.code()) << e.what() << " (op '" << op.name << "' on the CPU with a " << t.dtype()
                               << " input: the CPU kernels compute in f32; use a cuda placement for "
                                  "f16/bf16 compute, or cast to f32)";
      }
    }
    throw;
  }
}

const Kernel& KernelFor(const OpDef& op, DeviceType device) {
  auto it = op.kernels.find(device);
  TESSEL_CHECK(it != op.kernels.end())
      << "op '" << op.name << "' has no " << DeviceTypeName(device) << " kernel";
  return it->second;
}

// An in-place op must not write memory another of its inputs reads (AdamW
// with exp_avg and exp_avg_sq on one buffer would be silently wrong).
void CheckNoOverlap(const OpDef& op, const std::vector<Tensor>& locals) {
  for (int i : op.mutates) {
    const char* a = static_cast<const char*>(locals[i].raw_data());
    if (a == nullptr || locals[i].nbytes() == 0) continue;
    for (size_t j = 0; j < locals.size(); ++j) {
      const char* b = static_cast<const char*>(locals[j].raw_data());
      if (static_cast<int>(j) == i || b == nullptr || locals[j].nbytes() == 0) continue;
      TESSEL_CHECK(a + locals[i].nbytes() <= b || b + locals[j].nbytes() <= a)
          << "op '" << op.name << "' updates its input " << op.input_name(i)
          << " in place, but it shares memory with input " << op.input_name(j)
          << "; give each its own tensor (Clone())";
    }
  }
}

// An in-place op's outputs: its updated inputs themselves. The kernel wrote
// into `written` (what it ran on); that must be the inputs' own storage.
std::vector<Tensor> MutatedInputs(const OpDef& op, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& written) {
  std::vector<Tensor> outs;
  for (int i : op.mutates) {
    const Tensor own = inputs[i].to_local();
    TESSEL_CHECK_CODE(written[i].raw_data() == own.raw_data(), StatusCode::kInternal)
        << "op '" << op.name << "' updated a copy of its input " << op.input_name(i)
        << " instead of the input";
    outs.push_back(inputs[i]);
  }
  return outs;
}

std::vector<Tensor> RunGlobal(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                              const std::vector<TensorSpec>& logical,
                              const std::vector<TensorSpec>& out_specs) {
  const Placement& placement = inputs[0].placement();
  for (size_t i = 1; i < inputs.size(); ++i) {
    TESSEL_CHECK(inputs[i].placement() == placement)
        << "op '" << op.name << "': inputs are on different placements (" << Describe(op, inputs)
        << "); move them to one placement with to_global first";
  }
  const std::shared_ptr<const NdSignature> sig_ref = InferNdSignature(op, attrs, inputs, placement);
  const NdSignature& sig = *sig_ref;
  const int rank = CurrentRank();
  std::vector<Tensor> locals;
  std::vector<Box> in_boxes, out_boxes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (VLOG_IS_ON(1) && inputs[i].nd_sbp() != sig.inputs[i]) {
      VLOG(1) << "op '" << op.name << "' boxes " << op.input_name(i) << " " << inputs[i].shape() << " "
              << inputs[i].nd_sbp() << " -> " << sig.inputs[i] << " on " << placement;
    }
    locals.push_back(BoxTo(inputs[i], placement, sig.inputs[i]).to_local());
    in_boxes.push_back(LocalBox(inputs[i].shape(), placement, sig.inputs[i], rank));
  }
  for (int o = 0; o < op.num_outputs; ++o)
    out_boxes.push_back(LocalBox(out_specs[o].shape, placement, sig.outputs[o], rank));
  std::vector<Tensor> outs;
  if (!op.mutates.empty()) CheckNoOverlap(op, locals);
  if (placement.Contains(rank)) {
    const Device device = locals.empty() ? Device::CPU() : locals[0].device();
    outs =
        RunKernel(op, placement.device_type(), KernelFor(op, placement.device_type()),
                  KernelContext{locals, attrs, device, nullptr, logical, out_specs, &in_boxes, &out_boxes});
  } else {
    for (int o = 0; o < op.num_outputs; ++o) {
      outs.push_back(Tensor::Empty(LocalBox(out_specs[o].shape, placement, sig.outputs[o], rank).shape(),
                                   out_specs[o].dtype));
    }
  }
  if (!op.mutates.empty()) return MutatedInputs(op, inputs, locals);
  for (int o = 0; o < op.num_outputs; ++o)
    outs[o] = MakeGlobal(outs[o], out_specs[o].shape, placement, sig.outputs[o]);
  return outs;
}

// TESSEL_PROFILE_OPS=1: time spent per op (kernel and boxing, not
// recording), printed to stderr at exit, slowest first. On a GPU the
// kernels run behind the host, so that is the host's time: dispatch, and
// waits when the launch queue is full. TESSEL_PROFILE_OPS=sync waits for
// the GPU before and after each op, so each op's figure is its GPU time
// plus its dispatch (the step gets slower: for finding where GPU time goes).
// TESSEL_PROFILE_OPS=events records a CUDA event in the GPU's queue before
// and after each op and reads them once the GPU has passed them, so the
// step runs at its speed and each op's figure is the GPU time between its
// events (which includes any wait of the GPU for the host to launch the
// op's kernels: an op of a GPU-bound step has none).
class OpProfile {
 public:
  enum class Mode { kHost, kSync, kEvents };
  static OpProfile* Get() {
    static OpProfile* profile = std::getenv("TESSEL_PROFILE_OPS") ? new OpProfile() : nullptr;
    return profile;
  }
  Mode mode() const { return mode_; }
  void WaitForDevice() const {
#ifdef TESSEL_HAS_CUDA
    if (mode_ == Mode::kSync && cuda::DeviceCount() > 0) cuda::Synchronize();
#endif
  }
  void Add(const std::string& op, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    AddLocked(op, seconds);
  }
#ifdef TESSEL_HAS_CUDA
  // Events mode: the op ran between these two events; spans the GPU has
  // passed are read now, without waiting.
  void AddSpan(const std::string& op, void* start, void* end) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({op, start, end});
    ReadSpans(/*wait=*/false);
  }
#endif

 private:
  OpProfile() {
    const std::string mode = std::getenv("TESSEL_PROFILE_OPS");
    mode_ = mode == "sync" ? Mode::kSync : mode == "events" ? Mode::kEvents : Mode::kHost;
#ifdef TESSEL_HAS_CUDA
    if (mode_ == Mode::kEvents && cuda::DeviceCount() == 0) mode_ = Mode::kHost;  // no GPU: host times
#else
    if (mode_ == Mode::kEvents) mode_ = Mode::kHost;
#endif
    std::atexit([] { Get()->Print(); });
  }
  void AddLocked(const std::string& op, double seconds) {
    auto& [total, calls] = totals_[op];
    total += seconds;
    ++calls;
  }
#ifdef TESSEL_HAS_CUDA
  struct Span {
    std::string op;
    void* start;
    void* end;
  };
  void ReadSpans(bool wait) {
    while (!pending_.empty() && (wait || cuda::EventDone(pending_.front().end))) {
      const Span& s = pending_.front();
      const float ms = cuda::ElapsedMs(s.start, s.end);
      if (ms >= 0) {
        AddLocked(s.op, ms * 1e-3);
      } else {
        ++unread_;
      }
      pending_.pop_front();
    }
  }
#endif
  void Print() {
    std::lock_guard<std::mutex> lock(mu_);
#ifdef TESSEL_HAS_CUDA
    ReadSpans(/*wait=*/true);
#endif
    std::vector<std::pair<double, std::string>> rows;
    double all = 0;
    for (const auto& [op, tc] : totals_) rows.push_back({tc.first, op}), all += tc.first;
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "tessel op profile (%.1f ms in ops%s):\n", all * 1e3,
                 mode_ == Mode::kEvents ? ", GPU time between events; host time for host ops" : "");
    if (unread_ > 0)
      std::fprintf(stderr, "  (%ld spans could not be read at exit)\n", static_cast<long>(unread_));
    for (const auto& [t, op] : rows) {
      std::fprintf(stderr, "  %-22s %9.2f ms %5.1f%%  %6ld calls\n", op.c_str(), t * 1e3, 100 * t / all,
                   static_cast<long>(totals_[op].second));
    }
  }
  Mode mode_ = Mode::kHost;
  std::mutex mu_;
  std::map<std::string, std::pair<double, int64_t>> totals_;
#ifdef TESSEL_HAS_CUDA
  std::deque<Span> pending_;
#endif
  int64_t unread_ = 0;
};

class EagerInterpreterImpl final : public Interpreter {
 public:
  std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) override {
    OpProfile* profile = OpProfile::Get();
    if (profile == nullptr) return Run(op, inputs, attrs);
#ifdef TESSEL_HAS_CUDA
    // Events mode times an op on its inputs' GPU; host ops (no GPU input)
    // keep host times.
    int gpu = -1;
    for (const Tensor& t : inputs)
      if (gpu < 0 && t.defined() && !t.is_lazy() && t.device().is_cuda()) gpu = t.device().index();
    if (profile->mode() == OpProfile::Mode::kEvents && gpu >= 0) {
      void* start = cuda::RecordEvent(gpu);
      std::vector<Tensor> outs;
      try {
        outs = Run(op, inputs, attrs);
      } catch (...) {
        cuda::DropEvent(start);
        throw;
      }
      profile->AddSpan(op.name, start, cuda::RecordEvent(gpu));
      return outs;
    }
#endif
    profile->WaitForDevice();
    auto t0 = std::chrono::steady_clock::now();
    std::vector<Tensor> outs = Run(op, inputs, attrs);
    profile->WaitForDevice();
    profile->Add(op.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return outs;
  }

 private:
  std::vector<Tensor> Run(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
    if (op.run) return op.run(inputs, attrs);
    std::vector<TensorSpec> specs;
    int globals = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      TESSEL_CHECK(inputs[i].defined())
          << "op '" << op.name << "': input " << op.input_name(i) << " is undefined";
      TESSEL_CHECK(!inputs[i].is_lazy())
          << "op '" << op.name << "': input " << op.input_name(i) << " is lazy " << inputs[i].ToString()
          << " and the eager interpreter needs data: a value traced into a graph used outside its "
             "build, or one autograd kept as metadata only because the op's OpDef::saved does not "
             "list it for its gradient";
      specs.push_back({inputs[i].shape(), inputs[i].dtype()});
      globals += inputs[i].is_global();
    }
    TESSEL_CHECK(globals == 0 || globals == static_cast<int>(inputs.size()))
        << "op '" << op.name << "' mixes local and global inputs (" << Describe(op, inputs)
        << "); make the local ones global with to_global";
    std::vector<TensorSpec> out_specs;
    try {
      out_specs = op.infer(specs, attrs);
    } catch (const Error& e) {
      TESSEL_THROW(e.code()) << "op '" << op.name << "' on " << Describe(op, inputs) << ": " << e.what();
    }
    std::vector<Tensor> outs;
    if (globals > 0) {
      outs = RunGlobal(op, inputs, attrs, specs, out_specs);
    } else {
      std::vector<Tensor> locals;
      for (const Tensor& t : inputs) locals.push_back(t.detach());
      if (!op.mutates.empty()) CheckNoOverlap(op, locals);
      // Local tensors are whole: the context's boxes default to that.
      const Device device = inputs.empty() ? Device::CPU() : inputs[0].device();
      for (const Tensor& t : inputs) {
        TESSEL_CHECK(t.device() == device)
            << "op '" << op.name << "' has inputs on " << device << " and " << t.device() << " ("
            << Describe(op, inputs) << "); move them to one device with .To() first";
      }
      outs = RunKernel(op, device.type(), KernelFor(op, device.type()),
                       KernelContext{locals, attrs, device, nullptr, specs, out_specs});
      if (!op.mutates.empty()) outs = MutatedInputs(op, inputs, locals);
    }
    return outs;
  }
};

}  // namespace

Interpreter& EagerInterpreter() {
  static auto* eager = new EagerInterpreterImpl();  // never destroyed: ops may run at exit
  return *eager;
}

Interpreter& EagerAutogradInterpreter() {
  static auto* eager_autograd = new AutogradInterpreter(EagerInterpreter());
  return *eager_autograd;
}

void InstallEagerInterpreter() { SetDefaultInterpreter(&EagerAutogradInterpreter()); }

}  // namespace tessel
