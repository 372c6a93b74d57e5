#include "sbp/placement.h"

#include <gtest/gtest.h>

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
