#include "sbp/placement.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/error.h"
#include "sbp/sbp_proto.h"
#include "tests/testing/test_util.h"

namespace tessel {
namespace {

using testing::ErrorOf;

TEST(Placement, ConstructParsePrint) {
  Placement p("cpu", {{0, 1}, {2, 3}});
  EXPECT_EQ(p.hierarchy(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p.ToString(), "cpu:[[0, 1], [2, 3]]");
  EXPECT_EQ(Placement::Parse("cpu:[[0,1],[2,3]]"), p);
  EXPECT_EQ(Placement::Parse("cpu:[4, 5]"), Placement("cpu", {4, 5}));
  Placement cube = Placement::Parse("cpu:[[[0,1],[2,3]],[[4,5],[6,7]]]");
  EXPECT_EQ(cube.hierarchy(), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(cube.ToString(), "cpu:[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]");
  EXPECT_EQ(Placement::Parse(cube.ToString()), cube);
  Placement pr = PlacementFromProto(ToProto(cube));
  EXPECT_EQ(pr, cube);
}

TEST(Placement, CoordinatesAndGroups) {
  Placement p(DeviceType::kCPU, {10, 11, 12, 13, 14, 15}, {2, 3});
  EXPECT_EQ(p.Coord(4), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(p.IndexOfCoord({1, 2}), 5);
  EXPECT_EQ(p.IndexOf(12), 2);
  EXPECT_EQ(p.IndexOf(3), -1);
  EXPECT_EQ(p.GroupAlong(4, 0), (std::vector<int>{11, 14}));
  EXPECT_EQ(p.GroupAlong(4, 1), (std::vector<int>{13, 14, 15}));
}

TEST(Placement, EqualPlacementsAreInterned) {
  const Placement a("cpu", {{0, 1}, {2, 3}});
  const Placement b = Placement::Parse("cpu:[[0,1],[2,3]]");
  const Placement c(DeviceType::kCPU, {0, 1, 2, 3}, {2, 2});
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(a.id(), c.id());
  EXPECT_EQ(&a.ranks(), &b.ranks());  // one record, shared
  // Another grid, order, device or rank set is another placement.
  EXPECT_NE(a.id(), Placement("cpu", {0, 1, 2, 3}).id());
  EXPECT_NE(a.id(), Placement("cpu", {{0, 2}, {1, 3}}).id());
  EXPECT_NE(a.id(), Placement(DeviceType::kCUDA, {0, 1, 2, 3}, {2, 2}).id());
  EXPECT_NE(a, Placement("cpu", {{0, 1}, {2, 4}}));
  EXPECT_EQ(Placement().id(), 0u);
  EXPECT_EQ(Placement(), Placement());
}

TEST(Placement, IdsAreNeverReusedAndTheTableForgetsDeadPlacements) {
  uint64_t first;
  {
    const Placement p("cpu", {91, 92, 93});
    first = p.id();
  }
  // The last copy is gone: the same value gets a new id, so a cache entry
  // keyed on the old one cannot be confused with anything alive.
  const Placement again("cpu", {91, 92, 93});
  EXPECT_GT(again.id(), first);
  // Many short-lived placements: each is new, none is kept.
  uint64_t last = again.id();
  for (int i = 0; i < 1000; ++i) {
    const Placement p("cpu", {1000 + i, 5000 + i});
    EXPECT_GT(p.id(), last);
    last = p.id();
  }
}

TEST(Placement, InterningIsThreadSafe) {
  const Placement held("cpu", {{0, 1}, {2, 3}});  // alive throughout: one id
  std::vector<uint64_t> ids(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &ids] {
      for (int i = 0; i < 2000; ++i) {
        const Placement p("cpu", {{0, 1}, {2, 3}});
        const Placement other("cpu", {t, 100 + i});  // created and dropped concurrently
        if (i == 0) ids[t] = p.id();
        ASSERT_EQ(p.id(), ids[t]) << "thread " << t;
        ASSERT_NE(other.id(), p.id());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(ids[t], held.id());
}

TEST(Placement, BadInputIsNamed) {
  EXPECT_NE(ErrorOf([] { Placement("cpu", {0, 1, 1}); }).find("list rank 1 twice"), std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Placement(DeviceType::kCPU, {0, 1, 2}, {2, 2});
            }).find("hierarchy [2, 2] has 4 slots but 3 ranks were given"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { Placement("cpu", {0, -1}); }).find("negative rank -1"), std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Placement("cpu", {0, 1, 7}).CheckInWorld(4);
            }).find("names rank 7, outside the world of WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { Placement::Parse("cpu:[[0,1],[2]]"); }).find("rectangular grid"), std::string::npos);
  EXPECT_NE(ErrorOf([] { Placement::Parse("tpu:[0]"); }).find("unknown device type 'tpu'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { Placement("cpu", {{0, 1}, {2}}); }).find("rectangular"), std::string::npos);
}

}  // namespace
}  // namespace tessel
