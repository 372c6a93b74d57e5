// The pass manager: a fixed, printable order; a timing per pass; the graph
// written before and after a pass on request; a wrong pass name refused
// before anything runs.
#include "graph/passes/pass_manager.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/graph/small_graph.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// z = neg(x) read as broadcast: boxing insertion adds one to_global.
testing::SmallGraph Graph() {
  testing::SmallGraph g("step/1", Placement("cpu", std::vector<int>{0, 1}));
  const int x = g.Input("x", {4, 4}, NdSbp({S(0)}));
  const int z = g.Op("neg", {x}, {NdSbp({S(0)})}, {4, 4}, NdSbp({S(0)}));
  g.Op("exp", {x}, {NdSbp({S(0)})}, {4, 4}, NdSbp({S(0)}));  // dead
  g.graph.MarkOutput("t", g.Op("tanh", {z}, {NdSbp({B()})}, {4, 4}, NdSbp({B()})));
  return g;
}

TEST(PassManager, RunsThePassesInTheirPrintedOrderAndTimesEach) {
  EXPECT_EQ(passes::DescribePassOrder().substr(0, 29), "1. activation_checkpointing: ");
  std::vector<std::string> names;
  for (const passes::Pass& p : passes::PassOrder()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"activation_checkpointing", "dead_code_elimination",
                                             "gradient_accumulation", "boxing_insertion", "stage_assignment",
                                             "gradient_bucketing"}));
  testing::SmallGraph g = Graph();
  const std::vector<passes::PassTiming> t = passes::CompileGraph(g.graph, passes::CompileOptions{});
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0].ops_after, 3u);  // no recompute regions
  EXPECT_EQ(t[1].pass, "dead_code_elimination");
  EXPECT_EQ(t[1].ops_before, 3u);
  EXPECT_EQ(t[1].ops_after, 2u);
  EXPECT_EQ(t[2].ops_after, 2u);  // one micro-batch: nothing to copy
  EXPECT_EQ(t[3].ops_after, 3u);  // the to_global
  for (const passes::PassTiming& p : t) EXPECT_GE(p.seconds, 0);
  EXPECT_EQ(g.Count("to_global"), 1);
}

TEST(PassManager, WritesTheGraphBeforeAndAfterTheNamedPass) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    std::string("tessel_debug_pass_").append(std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  passes::CompileOptions options;
  options.debug_pass = "boxing_insertion";
  options.debug_dir = dir.string();
  testing::SmallGraph g = Graph();
  passes::CompileGraph(g.graph, options);
  // "step/1" is written as step_1; only the named pass is written.
  const std::string stem = (dir / "step_1.rank0.04-boxing_insertion.").string();
  const std::string before = ReadFile(stem + "before.txt"), after = ReadFile(stem + "after.txt");
  EXPECT_EQ(before.find("to_global"), std::string::npos) << before;
  EXPECT_NE(after.find("to_global"), std::string::npos) << after;
  EXPECT_EQ(ReadFile(stem + "after.dot").rfind("digraph", 0), 0u);
  EXPECT_TRUE(std::filesystem::exists(stem + "before.dot"));
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files += entry.is_regular_file();
  EXPECT_EQ(files, 4);
  // ALL writes every pass's.
  std::filesystem::remove_all(dir);
  options.debug_pass = "ALL";
  testing::SmallGraph all = Graph();
  passes::CompileGraph(all.graph, options);
  files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files += entry.is_regular_file();
  EXPECT_EQ(files, 6 * 4);
  std::filesystem::remove_all(dir);
}

TEST(PassManager, AnUnknownDebugPassIsRefusedBeforeAnyPassRuns) {
  passes::CompileOptions options;
  options.debug_pass = "boxing";
  testing::SmallGraph g = Graph();
  const std::string msg = testing::ErrorOf([&] { passes::CompileGraph(g.graph, options); });
  EXPECT_NE(msg.find("TESSEL_DEBUG_PASS is 'boxing'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4. boxing_insertion"), std::string::npos) << msg;
  EXPECT_EQ(g.graph.ops().size(), 3u);  // untouched
}

}  // namespace
}  // namespace tessel
