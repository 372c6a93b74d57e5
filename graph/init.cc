#include "graph/init.h"

#include "core/init.h"
#include "graph/eager_interpreter.h"
#include "graph/global_tensor_ops.h"

namespace tessel {

void Init(int* argc, char*** argv) {
  InitProcess(argc, argv);
  EnsureLayoutOps();
  InstallEagerInterpreter();
}

}  // namespace tessel
