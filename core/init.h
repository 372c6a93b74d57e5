// Process start-up: flags, logging and rendezvous.
#pragma once

namespace tessel {

// Parses command-line flags (gflags; unknown flags are an error), sets up
// glog, reads the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)
// and joins the world: after it returns, comm::World() is ready. A tessel
// Error that escapes main afterwards is printed with the rank and the
// process exits 1 instead of aborting.
void Init(int* argc, char*** argv);

// Leaves the world in order (rank 0 keeps serving the store until every rank
// is done). Called automatically at exit; calling it earlier is harmless.
void Shutdown();

}  // namespace tessel
