// A rank's physical plan: what one rank runs of a compiled graph. Each rank
// compiles its own from the logical graph (as OneFlow does), so a plan's
// size and its compile time follow the logical graph, not the world size.
//
// The plan holds only the ops the rank takes part in: ops whose placement
// holds it (and local ops, which every rank runs), layout changes whose
// source or destination placement holds it, with each communication step
// it makes (collectives with their group, point-to-point sends and
// receives with their peer) as the rank's executable plan
// (graph/plan/exec_plan.h) resolved them: what the runtime runs.
// It serialises to the same bytes on every compile.
#pragma once

#include <string>

#include "graph/ir/graph_ir.h"
#include "graph/plan/exec_plan.h"

namespace tessel {
namespace proto {
class RankPlanProto;
}

// Compiles rank `rank`'s plan of `graph` (a compiled graph: boxing made
// explicit). The rank need not lie in this process's world.
// With `instructions`, also the executable plan's instructions in words
// (ExecPlan::ToText).
void CompileRankPlan(const ir::Graph& graph, int rank, proto::RankPlanProto* plan,
                     std::string* instructions = nullptr);
// The same from the rank's executable plan (lowered with the ops the rank
// takes part in): its communication is that of the plan's instructions.
void CompileRankPlan(const plan::ExecPlan& exec, proto::RankPlanProto* plan);

// The plan in words: one line per op with its communication, then the
// communication per step by kind.
std::string RankPlanText(const proto::RankPlanProto& plan);

}  // namespace tessel
