// Interpreters: what functional ops are applied through. Each thread has a
// stack of them; the innermost InterpreterScope's interpreter handles every
// op the thread applies, and a thread with none uses the process default.
// graph/ provides the interpreters (eager, autograd over another one; a lazy
// graph builder pushes its own while it traces) and tessel::Init installs
// the default explicitly: nothing here depends on static initialisation.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/op_def.h"

namespace tessel {

class Interpreter {
 public:
  virtual ~Interpreter() = default;
  virtual std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs,
                                    const Attrs& attrs) = 0;
  // Whether ops are recorded into a graph rather than run (a tracer, or a
  // layer over one).
  virtual bool records() const { return false; }
};

// The interpreter ops applied on this thread go through: the innermost
// scope's, else the process default; throws (saying how to install one)
// when there is neither.
Interpreter& CurrentInterpreter();

// Whether this thread's ops are being recorded into a graph. Code that keeps
// per-call state on the host (DropPath's mask counter) checks it: a captured
// graph would replay the state of the one call it recorded.
bool IsTracing();

// Sets the process default (what threads without a scope use); returns the
// previous one. Null clears it.
Interpreter* SetDefaultInterpreter(Interpreter* interpreter);
Interpreter* DefaultInterpreter();

// Pushes `interpreter` on this thread's stack for the scope's lifetime.
// Scopes nest and must end in reverse order (they are stack objects).
class InterpreterScope {
 public:
  explicit InterpreterScope(Interpreter& interpreter);
  ~InterpreterScope();
  InterpreterScope(const InterpreterScope&) = delete;
  InterpreterScope& operator=(const InterpreterScope&) = delete;

 private:
  Interpreter* interpreter_;
};

}  // namespace tessel
