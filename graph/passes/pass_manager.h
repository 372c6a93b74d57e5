// The graph compiler's driver: runs the passes (passes.h) over a traced
// graph in a fixed, printable order, verifying the graph after each
// (ir::Verify) and logging each pass's time. A pass that fails is named in
// the error, with the op its check names.
//
// Debugging: --debug_pass=<pass name | ALL> (or TESSEL_DEBUG_PASS) writes
// the graph before and after that pass as text and as Graphviz dot into
// --debug_pass_dir (or TESSEL_DEBUG_PASS_DIR; default "."), one file per
// graph, rank, pass and side:
//   <dir>/<graph>.rank<R>.<NN>-<pass>.{before,after}.{txt,dot}
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/ir/graph_ir.h"

namespace tessel::passes {

struct CompileOptions {
  // The most logical bytes of gradients one all-reduce bucket holds; <= 0
  // turns gradient bucketing off.
  int64_t grad_bucket_bytes = 25 << 20;
  // Gradient accumulation: micro-batches per step (1: off). Set by the
  // Graph from GraphOptions, not by a flag: it changes what a step means.
  int micro_batches = 1;
  // Pipeline stages (stage_assignment): the world ranks of each stage, no
  // rank in two, and the stage of each model layer (layer_idx). Set by the
  // Graph from GraphOptions. Empty: no pipeline, nothing to assign.
  std::vector<std::vector<int>> stage_ranks = {};
  std::vector<int64_t> layer_stages = {};
  // A pass name, or "ALL", whose input and output graphs are written to
  // debug_dir; empty: none.
  std::string debug_pass;
  std::string debug_dir = ".";

  // From --grad_bucket_mb, --debug_pass and --debug_pass_dir; an unset
  // flag takes TESSEL_GRAD_BUCKET_MB, TESSEL_DEBUG_PASS or
  // TESSEL_DEBUG_PASS_DIR from the environment.
  static CompileOptions FromFlags();
};

struct Pass {
  std::string name;
  std::string does;  // one line, for DescribePassOrder
  std::function<void(ir::Graph&, const CompileOptions&)> run;
  // After this pass (and every later one) no op reads a value in another
  // layout: ir::Verify checks that too.
  bool makes_boxing_explicit = false;
};

// The passes in the order they run.
const std::vector<Pass>& PassOrder();
// "1. dead_code_elimination: ..." one line per pass.
std::string DescribePassOrder();

struct PassTiming {
  std::string pass;
  double seconds = 0;
  size_t ops_before = 0, ops_after = 0;
};

// Runs every pass over `graph`; returns what each took. Throws before any
// pass runs if options.debug_pass names no pass.
std::vector<PassTiming> CompileGraph(ir::Graph& graph, const CompileOptions& options);

}  // namespace tessel::passes
