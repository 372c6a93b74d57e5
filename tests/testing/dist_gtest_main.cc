// main() for multi-process gtest binaries: gtest takes its flags, then
// tessel::Init takes the rest (timeouts, logging) and joins the world.
#include <gtest/gtest.h>

#include "graph/init.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tessel::Init(&argc, &argv);
  return RUN_ALL_TESTS();
}
