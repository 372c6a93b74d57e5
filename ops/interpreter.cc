#include "ops/interpreter.h"

#include <glog/logging.h>

#include <atomic>

#include "core/error.h"

namespace tessel {
namespace {
std::atomic<Interpreter*> g_default{nullptr};
thread_local std::vector<Interpreter*> t_stack;
}  // namespace

bool IsTracing() {
  Interpreter* current = !t_stack.empty() ? t_stack.back() : DefaultInterpreter();
  return current != nullptr && current->records();
}

Interpreter& CurrentInterpreter() {
  if (!t_stack.empty()) return *t_stack.back();
  Interpreter* fallback = g_default.load(std::memory_order_acquire);
  TESSEL_CHECK_CODE(fallback != nullptr, StatusCode::kInternal)
      << "no interpreter to apply ops: call tessel::Init(&argc, &argv) (it installs the eager one), "
         "or tessel::InstallEagerInterpreter(), or push one with InterpreterScope";
  return *fallback;
}

Interpreter* SetDefaultInterpreter(Interpreter* interpreter) {
  return g_default.exchange(interpreter, std::memory_order_acq_rel);
}

Interpreter* DefaultInterpreter() { return g_default.load(std::memory_order_acquire); }

InterpreterScope::InterpreterScope(Interpreter& interpreter) : interpreter_(&interpreter) {
  t_stack.push_back(interpreter_);
}

InterpreterScope::~InterpreterScope() {
  // Scopes are stack objects, so this one is on top; a mismatch is a bug
  // in tessel, not in the caller's input.
  if (!t_stack.empty() && t_stack.back() == interpreter_) {
    t_stack.pop_back();
  } else {
    LOG(DFATAL) << "InterpreterScope ended out of order";
  }
}

}  // namespace tessel
