// Building a model for a world this process is not part of, to compile a
// plan for it (tessel-plan): inside a MetaScope, parameters and optimizer
// state are metadata only (sbp/global_tensor.h: MetaWorldScope) and every
// functional op applied to them gives its results' specs — shape, dtype,
// placement, NdSbp, from the same inference eager dispatch and the tracer
// use — without running. A Graph traced inside the scope (its inputs
// metadata only too) compiles like any other, and each rank's plan can be
// compiled from it; it cannot run.
//
//   MetaScope meta(/*world_size=*/1024, /*rank=*/0);
//   dist::Setup({.tensor_parallel_size = 8, .pipeline_parallel_size = 16, ...});
//   models::GPT gpt(config);           // no parameter memory
//   const ir::Graph& g = step.Trace({{"ids", MakeMetaLocal({b, s}, DType::kInt64)}, ...});
#pragma once

#include <vector>

#include "ops/interpreter.h"
#include "sbp/global_tensor.h"

namespace tessel {

// Gives each op's results as metadata-only tensors (an identity each, no
// data). Ops that update inputs in place return those inputs, as eager does.
class MetaInterpreter final : public Interpreter {
 public:
  std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) override;
};

// A metadata-only local tensor with an identity of its own (a planned
// graph's input, or a local result of the MetaInterpreter).
Tensor MakeMetaLocal(const Shape& shape, DType dtype);

// A MetaWorldScope with the MetaInterpreter pushed under it.
class MetaScope {
 public:
  MetaScope(int world_size, int rank) : world_(world_size, rank), scope_(interpreter_) {}

 private:
  MetaWorldScope world_;
  MetaInterpreter interpreter_;
  InterpreterScope scope_;
};

}  // namespace tessel
