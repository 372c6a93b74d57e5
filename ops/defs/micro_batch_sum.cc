// micro_batch_sum: in a graph of micro-batch units (graph/passes:
// gradient_accumulation), the sum over every micro-batch of a value each
// one computes — a gradient's share, the loss. Its input belongs to the
// units (a slot per micro-batch), its result to the step. It has no
// kernel of its own: the executable plan (graph/plan/exec_plan.h) runs it
// as the running sum — micro-batch 0's share, then the `add` kernel of the
// sum so far and each later share, in micro-batch order
// (graph/passes/step_runs.h).
//
// The result keeps the input's layout (every layout sums share by share,
// partial sums included).
#include "ops/defs/def_util.h"

namespace tessel {

void RegisterMicroBatchSumOps() {
  OpDef def;
  def.name = "micro_batch_sum";
  def.grad_unsupported = "it marks where gradient accumulation sums micro-batches, after backward";
  def.inputs = {"share"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    const int64_t count = a.Get<int64_t>("count");
    TESSEL_CHECK(count >= 2) << "micro_batch_sum: count " << count << "; expected 2 or more micro-batches";
    return std::vector<TensorSpec>{in[0]};
  };
  def.sbp = defs::SplitAnyDimOrPartial;
  RegisterOp(std::move(def));
}

}  // namespace tessel
