// tessel-train: trains a model of the zoo from a config (configs/*.prototxt,
// schema zoo/config.proto) under the layout the config and the launch give.
//
//   tessel-launch --nproc_per_node 4 -- tessel-train --config configs/gpt2_tiny.prototxt
//   tessel-train --config configs/gpt2_tiny.prototxt --set train.train_iter=50 --set optim.lr=3e-4
//
// The program itself is tools/train/training_program.h, which a user's own
// program calls after registering its extensions.
#include "tools/train/training_program.h"

int main(int argc, char** argv) { return tessel::train::RunTrainingProgram(argc, argv); }
