// Boxing insertion on small graphs over a 2x2 mesh: exactly one to_global
// per (value, layout) a reader needs that differs from the value's own,
// shared by the readers wanting that layout, none where layouts agree; a
// to_global that changes nothing is removed; an updated input is never
// converted.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <utility>

#include "graph/passes/pass_manager.h"
#include "graph/passes/passes.h"
#include "tests/graph/small_graph.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::SmallGraph;

TEST(BoxingInsertion, OneConversionPerValueAndLayoutNoneElsewhere) {
  SmallGraph g("mlp", Placement("cpu", {{0, 1}, {2, 3}}));
  const NdSbp s0b({S(0), B()}), bs1({B(), S(1)}), bs0({B(), S(0)}), s0s1({S(0), S(1)}), s0p({S(0), P()}),
      bb({B(), B()});
  const int x = g.Input("x", {16, 8}, s0b);
  const int w1 = g.Input("w1", {8, 12}, bs1);
  const int w2 = g.Input("w2", {12, 8}, bs0);
  const int h = g.Op("matmul", {x, w1}, {s0b, bs1}, {16, 12}, s0s1);
  const int z = g.Op("matmul", {h, w2}, {s0s1, bs0}, {16, 8}, s0p);  // partial along tp
  // Two readers want z as [S(0), B] (one conversion), one reads it as it is
  // (a sum keeps the partial), one wants [S(0), S(1)].
  const int t = g.Op("tanh", {z}, {s0b}, {16, 8}, s0b);
  const int r = g.Op("relu", {z}, {s0b}, {16, 8}, s0b);
  const int sum = g.Op("add", {z, z}, {s0p, s0p}, {16, 8}, s0p);
  const int n = g.Op("neg", {z}, {s0s1}, {16, 8}, s0s1);
  // x read as broadcast by one op: another conversion.
  const int xb = g.Op("exp", {x}, {bb}, {16, 8}, bb);
  for (auto [name, v] : {std::pair{"t", t}, {"r", r}, {"sum", sum}, {"n", n}, {"xb", xb}})
    g.graph.MarkOutput(name, v);

  const auto want = testing::ImplicitBoxings(g.graph);
  ASSERT_EQ(want.size(), 3u);  // (z, [S(0), B]), (z, [S(0), S(1)]), (x, [B, B])
  const size_t ops_before = g.graph.ops().size();
  passes::InsertBoxing(g.graph);
  ir::Verify(g.graph, /*explicit_boxing=*/true);
  EXPECT_EQ(g.graph.ops().size(), ops_before + want.size());
  // Each to_global converts one wanted (value, layout) pair, each pair once,
  // and is placed before its first reader.
  std::set<std::pair<int, std::string>> got;
  for (const testing::LayoutChange& c : testing::LayoutChanges(g.graph)) {
    EXPECT_TRUE(c.changes) << "%" << c.value;
    EXPECT_TRUE(got.insert({c.value, c.to}).second) << "%" << c.value << " converted twice";
  }
  EXPECT_EQ(got, want);
  for (const ir::Op& op : g.graph.ops()) {
    if (op.name != "to_global") continue;
    const ir::Value& out = g.graph.value(op.outputs[0]);
    const std::vector<int>& next_reads = g.graph.ops().at(op.id + 1).inputs;
    EXPECT_NE(std::find(next_reads.begin(), next_reads.end(), out.id), next_reads.end())
        << "to_global %" << out.id << " is not right before its first reader";
  }
  // tanh and relu share one conversion; add still reads z itself.
  const ir::Op& tanh = g.graph.ops()[g.graph.value(t).producer];
  const ir::Op& relu = g.graph.ops()[g.graph.value(r).producer];
  EXPECT_EQ(tanh.inputs, relu.inputs);
  EXPECT_EQ(g.graph.ops()[g.graph.value(tanh.inputs[0]).producer].name, "to_global");
  EXPECT_EQ(g.graph.ops()[g.graph.value(sum).producer].inputs, (std::vector<int>{z, z}));
  // A second run finds nothing to do.
  const std::string text = g.graph.ToText();
  passes::InsertBoxing(g.graph);
  EXPECT_EQ(g.graph.ToText(), text);
}

TEST(BoxingInsertion, ConversionsThatChangeNothingAreRemoved) {
  SmallGraph g("identity", Placement("cpu", std::vector<int>{0, 1}));
  const int x = g.Input("x", {4, 4}, NdSbp({S(0)}));
  const int same = g.ToGlobal(x, NdSbp({S(0)}));  // kept by a trace for its gradient's layout
  const int y = g.Op("tanh", {same}, {NdSbp({S(0)})}, {4, 4}, NdSbp({S(0)}));
  const int moved = g.ToGlobal(y, NdSbp({B()}));  // a real change stays
  g.graph.MarkOutput("same", same);
  g.graph.MarkOutput("moved", moved);
  passes::InsertBoxing(g.graph);
  ir::Verify(g.graph, true);
  ASSERT_EQ(g.graph.ops().size(), 2u);
  EXPECT_EQ(g.graph.ops()[0].name, "tanh");
  EXPECT_EQ(g.graph.ops()[0].inputs, std::vector<int>{x});
  EXPECT_EQ(g.graph.outputs().at("same"), x);  // the result is the input itself now
  EXPECT_EQ(g.graph.outputs().at("moved"), moved);
}

TEST(BoxingInsertion, AnUpdatedInputIsNeverConvertedAndThePassIsNamed) {
  SmallGraph g("sgd", Placement("cpu", std::vector<int>{0, 1}));
  const NdSbp s0({S(0)}), b({B()});
  const int w = g.Input("w", {4}, s0);
  const int grad = g.Input("g", {4}, b);
  const int buf = g.Input("buf", {4}, b);
  // A signature that would read w as B: converting it would update a copy.
  g.graph.AddOp("sgd_update",
                Attrs{{"lr", 0.1}, {"momentum", 0.0}, {"weight_decay", 0.0}, {"nesterov", false}},
                {w, grad, buf}, {g.Spec({4}, b), g.Spec({4}, b)}, {b, b, b}, {b, b});
  const std::string msg = testing::ErrorOf([&] { passes::CompileGraph(g.graph, passes::CompileOptions{}); });
  EXPECT_NE(msg.find("compiler pass boxing_insertion failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("op 0 'sgd_update'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("never converted"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tessel
