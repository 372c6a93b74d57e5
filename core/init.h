// Process start-up: flags, logging and rendezvous.
#pragma once

namespace tessel {

// The process part of tessel::Init (graph/init.h), for programs that link
// only tessel::core: parses command-line flags (gflags; unknown flags are an
// error), sets up glog, reads the launcher's environment (RANK, WORLD_SIZE,
// MASTER_ADDR, ...) and joins the world: after it returns, comm::World() is
// ready. A tessel Error that escapes main afterwards is printed with the
// rank and the process exits 1 instead of aborting.
void InitProcess(int* argc, char*** argv);

// Lockstep checks, a debug mode (--check_lockstep, or TESSEL_CHECK_LOCKSTEP=1;
// the multi-process tests turn it on): before a layout change, ranks
// exchange what they ask for, so a rank that asks for a different layout,
// placement, dtype or shape fails at once on every rank, named, instead of
// hanging in mismatched collectives. Off by default: it adds a world-wide
// collective per layout change.
bool LockstepChecksEnabled();
void SetLockstepChecks(bool enabled);

// Leaves the world in order (rank 0 keeps serving the store until every rank
// is done). Called automatically at exit; calling it earlier is harmless.
void Shutdown();

}  // namespace tessel
