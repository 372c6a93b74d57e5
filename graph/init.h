// tessel::Init: what a tessel program calls first.
#pragma once

namespace tessel {

// Parses command-line flags (gflags; unknown flags are an error), sets up
// glog, reads the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)
// and joins the world (core/init.h: InitProcess), then installs the eager
// interpreter with autograd as the default for functional ops. After it
// returns, comm::World() is ready. A tessel Error that escapes main
// afterwards is printed with the rank and the process exits 1 instead of
// aborting.
void Init(int* argc, char*** argv);

}  // namespace tessel
