// Heartbeat lines as the launcher parses them: groups at the edges of the
// rank range.
#include "core/comm/heartbeat.h"

#include <gtest/gtest.h>

namespace tessel::comm {
namespace {

constexpr const char* kPrefix =
    "tessel-hb 1 rank=0 phase=run state=in op=all_reduce seq=7 bytes=4 age_ms=2100 group=";

// A group holding the largest rank id ended the parse's loop never (its int
// counter overflowed): the launcher looped until it aborted.
TEST(Heartbeat, GroupsAtTheLargestRankIdParse) {
  auto hb = ParseHeartbeat(std::string(kPrefix) + "2147483647");
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->group, (std::vector<int>{2147483647}));
  hb = ParseHeartbeat(std::string(kPrefix) + "2147483640-2147483647");
  ASSERT_TRUE(hb.has_value());
  EXPECT_EQ(hb->group.size(), 8u);
  EXPECT_EQ(hb->group.back(), 2147483647);
}

TEST(Heartbeat, GroupsOutOfRangeAreRejected) {
  for (const char* group : {"2147483648", "0-2147483647", "5-3", "-1", "0-99999,1-99999"})
    EXPECT_FALSE(ParseHeartbeat(std::string(kPrefix) + group).has_value()) << group;
}

}  // namespace
}  // namespace tessel::comm
