// The models tessel-train can build, by model.arch: the zoo's (gpt2, llama,
// t5, bert, vit) and those a program of its own registers before it runs
// the training program (docs/extending.md):
//
//   int main(int argc, char** argv) {
//     tessel::train::RegisterCausalLM("token_mlp", BuildTokenMlp);
//     return tessel::train::RunTrainingProgram(argc, argv);
//   }
//
// A registered model gets everything the zoo's models get: graph mode and
// pipelines (its layers' layer_idx give the stages), checkpoints and
// resume, evaluation, metrics and TensorBoard.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tools/train/model_config.h"
#include "tools/train/task.h"

namespace tessel::train {

// Builds a model with its data and evaluation (a Task) from the resolved
// config, under the dist layout the config set up: checks the data and the
// model section (the typed fields it reads, model.options) and throws
// naming a field before any training.
using ModelFactory = std::function<std::unique_ptr<Task>(const TaskContext& context)>;
// Registers `name` for model.arch; throws if the name is taken (the zoo's
// included) or not letters, digits, '_', '-' or '.'.
void RegisterModel(const std::string& name, ModelFactory factory);

// Builds a causal language model from the resolved config (model.*),
// under the current dist layout: its module, its loss of ids [batch, seq]
// against the next tokens, and its forward FLOPs per token (required: the
// log's TFLOP/s and MFU).
using CausalLMFactory = std::function<CausalLM(const config::Config& config)>;
// Registers a causal language model that trains on token data as GPT-2
// does: samples of model.max_seq_length + 1 tokens from data.data_prefix
// (or data.blend), ids on the first stage and labels on the last;
// evaluation reports loss and perplexity.
void RegisterCausalLM(const std::string& name, CausalLMFactory factory);

// The names model.arch may take, sorted (the zoo's and the registered).
std::vector<std::string> ModelNames();

// The task of the config's model.arch (an unknown name throws, listing
// the registered ones).
std::unique_ptr<Task> MakeTask(const TaskContext& context);

// The causal-language-model task of a model `build` makes (what
// RegisterCausalLM registers; gpt2 and llama are this with BuildCausalLM).
std::unique_ptr<Task> MakeCausalLMTask(const TaskContext& context, const CausalLMFactory& build);

}  // namespace tessel::train
