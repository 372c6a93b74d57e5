// Saving a plan and reusing it (ParallelPlan <-> a protobuf text file):
// a plan made once (by "auto", say, which times trials) is loaded by the
// "plan file" policy the next time the same model is parallelized over the
// same number of ranks, without searching again.
//
//   parallel::SavePlan(pm->plan(), "gpt.plan");
//   ...
//   auto pm = parallel::parallelize(gpt, batch, parallel::PlanFromFile("gpt.plan"), config);
#pragma once

#include <string>

#include "parallel/plan.h"

namespace tessel::parallel {

// Plan files are at most this big (the reader refuses larger ones before
// reading them).
inline constexpr size_t kMaxPlanFileBytes = 16 << 20;

// What a plan is made for, as text: a hash of the traced forward (each op's
// name and its values' shapes and dtypes, in order), the parameters' names
// and shapes and the inputs' specs. parallelize sets it on the plans it
// makes.
std::string ModelFingerprint(const ir::Graph& one_device_forward);

// The plan (with its model_fingerprint and plan_ranks) as protobuf text.
std::string PlanToText(const ParallelPlan& plan);
// Throws naming the problem (not a plan, a field out of range, too large)
// for anything else; `source` names the text in messages.
ParallelPlan ParsePlanText(const std::string& text, const std::string& source);

void SavePlan(const ParallelPlan& plan, const std::string& path);
// A policy that returns the plan saved at `path`, after checking it was
// made for this model (the fingerprint) and this plan size; throws naming
// what differs otherwise.
Policy PlanFromFile(const std::string& path);

}  // namespace tessel::parallel
