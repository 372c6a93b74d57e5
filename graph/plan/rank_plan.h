// A rank's physical plan: what one rank runs of a compiled graph. Each rank
// compiles its own from the logical graph (as OneFlow does), so a plan's
// size and its compile time follow the logical graph, not the world size.
//
// The plan holds only the ops the rank takes part in: ops whose placement
// holds it (and local ops, which every rank runs), layout changes whose
// source or destination placement holds it, with each communication step
// it makes (collectives with their group, point-to-point sends and
// receives with their peer) from the same boxing planner eager mode uses.
// It serialises to the same bytes on every compile.
#pragma once

#include <string>

#include "graph/ir/graph_ir.h"

namespace tessel {
namespace proto {
class RankPlanProto;
}

// Compiles rank `rank`'s plan of `graph` (a compiled graph: boxing made
// explicit). The rank need not lie in this process's world.
void CompileRankPlan(const ir::Graph& graph, int rank, proto::RankPlanProto* plan);

// The plan in words: one line per op with its communication, then the
// communication per step by kind.
std::string RankPlanText(const proto::RankPlanProto& plan);

}  // namespace tessel
