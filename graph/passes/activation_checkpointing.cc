// Activation checkpointing as a rewrite: backward reads of a checkpointed
// region's activations move to a copy of the region recomputed just before
// them, so the forward's activations die inside the forward.
#include <map>
#include <set>
#include <vector>

#include "core/error.h"
#include "graph/passes/passes.h"

namespace tessel::passes {
namespace {

struct Recompute {
  std::vector<ir::Op> clones;  // in forward order, with new outputs
  size_t before = 0;           // index of the first backward op that reads the region
};

}  // namespace

void RecomputeCheckpointedRegions(ir::Graph& graph) {
  const std::vector<ir::Op>& ops = graph.ops();
  std::map<int, std::vector<size_t>> regions;  // region -> its forward ops
  for (size_t i = 0; i < ops.size(); ++i)
    if (!ops[i].backward && ops[i].recompute_region >= 0) regions[ops[i].recompute_region].push_back(i);
  if (regions.empty()) return;

  // A region's forward ops, by the values they produce.
  std::map<int, int> region_of_value;
  for (const auto& [region, members] : regions)
    for (size_t i : members)
      for (int v : ops[i].outputs) region_of_value[v] = region;
  // Where each value is updated in place during forward (the optimizer's
  // updates come once gradients exist, and read no activation).
  size_t first_backward = ops.size();
  for (size_t j = 0; j < ops.size() && first_backward == ops.size(); ++j)
    if (ops[j].backward) first_backward = j;
  std::map<int, std::vector<size_t>> updated_at;
  for (size_t j = 0; j < first_backward; ++j)
    for (int i : GetOpDef(ops[j].name).mutates)
      updated_at[ops[j].inputs.at(static_cast<size_t>(i))].push_back(j);
  // A region's outputs (values forward ops outside it read, and results)
  // are its checkpoints: they stay alive for the next region anyway, so
  // backward reads them as they are. So are the results of an op that
  // reads a value updated in place after it (a random stream's position,
  // which the layer moves on past its draw): a copy would read the new
  // value. They are small (scalars), or the region would keep little.
  std::set<int> checkpoints;
  for (const auto& [region, members] : regions) {
    for (size_t i : members) {
      bool reads_updated = false;
      for (int v : ops[i].inputs) {
        auto it = updated_at.find(v);
        if (it == updated_at.end()) continue;
        for (size_t j : it->second) reads_updated |= j > i;
      }
      if (reads_updated)
        for (int v : ops[i].outputs) checkpoints.insert(v);
    }
  }
  for (const ir::Op& op : ops) {
    if (op.backward) continue;
    for (int v : op.inputs) {
      auto it = region_of_value.find(v);
      if (it != region_of_value.end() && it->second != op.recompute_region) checkpoints.insert(v);
    }
  }
  for (const auto& [name, v] : graph.outputs()) checkpoints.insert(v);
  // Per region: the values inside it that backward reads, and the first
  // backward op that reads one.
  std::map<int, std::set<int>> needed_by_region;
  std::map<int, size_t> first_reader_of;
  for (size_t j = 0; j < ops.size(); ++j) {
    if (!ops[j].backward) continue;
    for (int v : ops[j].inputs) {
      auto it = region_of_value.find(v);
      if (it == region_of_value.end() || checkpoints.count(v)) continue;
      needed_by_region[it->second].insert(v);
      first_reader_of.try_emplace(it->second, j);
    }
  }
  std::vector<Recompute> recomputes;
  std::map<int, int> replacement;  // a region's value -> its recomputed copy, for backward readers
  for (auto& [region, needed] : needed_by_region) {
    const std::vector<size_t>& members = regions.at(region);
    const size_t first_reader = first_reader_of.at(region);
    // The region's ops those values need, walking back from the last.
    std::vector<bool> cloned(members.size(), false);
    for (size_t m = members.size(); m-- > 0;) {
      const ir::Op& op = ops[members[m]];
      bool wanted = false;
      for (int v : op.outputs) wanted |= needed.count(v) > 0;
      if (!wanted) continue;
      TESSEL_CHECK(GetOpDef(op.name).mutates.empty())
          << "activation checkpointing: op " << op.id << " '" << op.name << "' in recompute region " << region
          << " updates a variable in place, and backward reads its result; recomputing it would apply the "
             "update twice. Keep in-place updates out of RecomputeScope";
      cloned[m] = true;
      for (int v : op.inputs) {
        auto it = region_of_value.find(v);
        if (it != region_of_value.end() && it->second == region && !checkpoints.count(v)) needed.insert(v);
      }
    }
    TESSEL_CHECK_CODE(members[0] < first_reader, StatusCode::kInternal)
        << "activation checkpointing: backward op " << ops[first_reader].id << " '" << ops[first_reader].name
        << "' reads recompute region " << region << " before the region's forward";
    Recompute r;
    r.before = first_reader;
    std::map<int, int> copy_of;  // original value -> recomputed value
    for (size_t m = 0; m < members.size(); ++m) {
      if (!cloned[m]) continue;
      ir::Op clone = ops[members[m]];
      clone.backward = true;  // runs in backward, as the recomputation of its region
      for (int& v : clone.inputs) {
        auto it = copy_of.find(v);
        if (it != copy_of.end()) v = it->second;
      }
      for (int& v : clone.outputs) {
        const ir::Value spec = graph.value(v);  // a copy: NewValue may move the values
        const int fresh = graph.NewValue(spec);
        copy_of[v] = fresh;
        v = fresh;
      }
      r.clones.push_back(std::move(clone));
    }
    // Only the values backward needs recomputed: an output of a cloned op
    // that is a checkpoint (another output of a multi-output op) stays the
    // forward's, which backward ops before the copy may read too.
    for (const auto& [original, copy] : copy_of)
      if (!checkpoints.count(original)) replacement.emplace(original, copy);
    recomputes.push_back(std::move(r));
  }
  if (recomputes.empty()) return;

  std::multimap<size_t, const Recompute*> at;
  for (const Recompute& r : recomputes) at.emplace(r.before, &r);
  std::vector<ir::Op> rewritten;
  rewritten.reserve(ops.size());
  for (size_t j = 0; j < ops.size(); ++j) {
    auto [begin, end] = at.equal_range(j);
    for (auto it = begin; it != end; ++it)
      for (const ir::Op& clone : it->second->clones) rewritten.push_back(clone);
    ir::Op op = ops[j];
    if (op.backward) {
      for (int& v : op.inputs) {
        auto it = replacement.find(v);
        if (it != replacement.end()) v = it->second;  // every backward reader comes after the copy
      }
    }
    rewritten.push_back(std::move(op));
  }
  graph.SetOps(std::move(rewritten));
}

}  // namespace tessel::passes
