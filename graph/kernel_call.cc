#include "graph/kernel_call.h"

#include "core/error.h"

namespace tessel {

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

}  // namespace tessel
