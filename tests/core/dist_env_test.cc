#include "core/comm/dist_env.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace tessel::comm {
namespace {

std::string ErrorOf(const std::map<std::string, std::string>& vars) {
  try {
    ParseDistEnv(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DistEnv, SingleProcessByDefault) {
  DistEnv env = ParseDistEnv({});
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
  EXPECT_FALSE(env.from_launcher);
}

TEST(DistEnv, LauncherVariables) {
  DistEnv env = ParseDistEnv({{"RANK", "5"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_RANK", "1"},
                              {"LOCAL_WORLD_SIZE", "4"},
                              {"MASTER_ADDR", "node0"},
                              {"MASTER_PORT", "29501"}});
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29501);
}

TEST(DistEnv, BadValuesAreNamed) {
  std::map<std::string, std::string> base = {
      {"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& k, const std::string& v) {
    auto m = base;
    m[k] = v;
    return m;
  };
  EXPECT_NE(ErrorOf(with("WORLD_SIZE", "abc")).find("WORLD_SIZE='abc' is not an integer"), std::string::npos);
  EXPECT_NE(ErrorOf(with("WORLD_SIZE", "0")).find("WORLD_SIZE=0 is out of range"), std::string::npos);
  EXPECT_NE(ErrorOf(with("RANK", "4")).find("RANK=4 is out of range; expected 0 <= RANK < WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(ErrorOf(with("RANK", "-1")).find("RANK=-1 is out of range"), std::string::npos);
  EXPECT_NE(ErrorOf(with("MASTER_PORT", "70000")).find("MASTER_PORT=70000 is out of range"),
            std::string::npos);
  EXPECT_NE(ErrorOf(with("LOCAL_WORLD_SIZE", "8")).find("LOCAL_WORLD_SIZE=8 is out of range"),
            std::string::npos);
  auto no_addr = base;
  no_addr.erase("MASTER_ADDR");
  EXPECT_NE(ErrorOf(no_addr).find("MASTER_ADDR is not set"), std::string::npos);
  EXPECT_NE(ErrorOf({{"RANK", "1"}}).find("RANK=1 is set but WORLD_SIZE is not"), std::string::npos);
}

}  // namespace
}  // namespace tessel::comm
