// The eager interpreters. tessel::Init installs EagerAutogradInterpreter()
// as the process default; programs that do not call Init (unit tests, tools
// without a world) call InstallEagerInterpreter() themselves.
#pragma once

#include "ops/interpreter.h"

namespace tessel {

// Runs each op now: boxes global inputs to the inferred signature and runs
// the kernel on this rank's shards. Records no autograd.
Interpreter& EagerInterpreter();
// Autograd over the eager interpreter: what ops use by default.
Interpreter& EagerAutogradInterpreter();
// Makes EagerAutogradInterpreter() the process default (idempotent).
void InstallEagerInterpreter();

}  // namespace tessel
