// main() for single-process gtest binaries that apply ops: gtest takes its
// flags, then the eager interpreter is installed explicitly (no world is
// joined; tests that need one use dist_gtest_main.cc).
#include <gtest/gtest.h>

#include "graph/eager_interpreter.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tessel::InstallEagerInterpreter();
  return RUN_ALL_TESTS();
}
