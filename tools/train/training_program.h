// The training program: what tessel-train runs, as a function, so that a
// program of the user's own can register its parallel modes, gradient
// handlers and pipeline schedules and then train from a config exactly as
// tessel-train does (docs/extending.md):
//
//   int main(int argc, char** argv) {
//     tessel::optim::RegisterGradientHandler("my_handler", ...);
//     return tessel::train::RunTrainingProgram(argc, argv);  // --config FILE [--set k=v ...]
//   }
//
// It takes tessel-train's flags (--config, --set, --resume, --fast_dev_run,
// --print_actions), initialises tessel (tessel::Init), and returns 0 when
// training ends; bad input throws tessel::Error before any work starts.
#pragma once

namespace tessel::train {

int RunTrainingProgram(int argc, char** argv);

}  // namespace tessel::train
