#include "graph/ir/meta.h"

#include "graph/ir/tracer.h"

namespace tessel {

Tensor MakeMetaLocal(const Shape& shape, DType dtype) {
  return Tensor::Lazy(shape, dtype, Device::CPU(), std::make_shared<const LazyValue>(nullptr, -1));
}

std::vector<Tensor> MetaInterpreter::Apply(const OpDef& op, const std::vector<Tensor>& inputs,
                                           const Attrs& attrs) {
  std::vector<Tensor> results;
  if (!op.mutates.empty()) {
    for (int i : op.mutates) results.push_back(inputs[i]);
    return results;
  }
  for (const ir::Value& v : InferOpResults(op, inputs, attrs, "meta").outputs) {
    results.push_back(v.is_global() ? MakeMetaGlobal(v.shape, v.dtype, v.placement, v.nd_sbp)
                                    : MakeMetaLocal(v.shape, v.dtype));
  }
  return results;
}

}  // namespace tessel
