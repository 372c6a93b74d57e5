// What a plan is predicted to cost per training step and per rank: the
// "auto" policy's yardstick (parallel/policies.cc), and what benchmarks
// print beside measured step times. The prediction reads the forward traced
// under the plan (every value's layout from signature inference): each
// op's work divided by the ranks that share it, each layout change as the
// collective or transfer it is, the backward as twice the forward's work
// and the same communication again, the pipeline's idle share (p-1)/(m+p-1),
// the data-parallel gradient all-reduce and AdamW. Stage transfers count
// their bytes but not their latency: the actor runtime overlaps them with
// compute. Rates come from
// CostModel, measured on the job's own ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/plan.h"

namespace tessel::parallel {

struct CostModel {
  double flops_per_s = 2e9;      // one rank's f32 matmul rate, with the job's other ranks busy too
  double elements_per_s = 5e8;   // elements an elementwise op (add) writes per second
  double op_overhead_s = 20e-6;  // per op run (dispatch, scheduling)
  double latency_s = 1e-3;       // per collective or stage transfer
  double bytes_per_s = 5e8;      // bytes a rank moves per second in a collective
  // Measured now: when the world has more than one rank, a small and a
  // 1 MiB all-reduce over it (then collective over the world: every rank
  // must call it, and all measure the rest at once, as they will train);
  // then a matmul, an elementwise op and a tiny op on this rank, averaged
  // over the ranks so that every rank plans with the same figures. Defaults
  // stand in for what cannot be measured.
  static CostModel Measure();
  std::string ToText() const;
};

struct PlanEstimate {
  double step_s = 0;           // predicted time of one training step
  double compute_s = 0;        // the busiest stage's arithmetic (forward and backward)
  double communication_s = 0;  // its collectives and transfers, and the gradient all-reduce
  double overhead_s = 0;       // its ops' dispatch
  double bubble = 0;           // the pipeline's idle share, (p-1)/(m+p-1)
  int64_t memory_bytes = 0;  // the fullest rank: parameters, gradients, AdamW moments, activations in flight
  int64_t collectives = 0;   // per step, forward and backward, on the busiest stage
  // "12.3 ms (compute 8.1, communication 3.0, overhead 1.2; bubble 0%), 4.5 MiB per rank"
  std::string ToText() const;
};

// Each element averaged over the world's ranks (an all-reduce, so every
// rank gets the same bits); `mine` itself in a world of one. Collective.
std::vector<double> MeanOverRanks(const std::vector<double>& mine);

PlanEstimate EstimatePlan(const PolicyContext& context, const ParallelPlan& plan, const CostModel& model);

}  // namespace tessel::parallel
