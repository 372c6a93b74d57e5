// The zoo's models as a training config describes them: what tessel-train
// builds and what tessel-plan plans, from one place.
#pragma once

#include "layers/transformer.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "zoo/config.pb.h"

namespace tessel::train {

// model.hidden_act as the layers' activation.
layers::Activation HiddenActivation(const config::ModelConfig& m);

// The GPT of a resolved config (model.*, train.seed,
// train.activation_checkpoint).
models::GPTConfig GptConfigOf(const config::Config& c);
// The Llama of a resolved config (model.*, with layernorm_epsilon as the
// RMSNorm's epsilon; train.seed, train.activation_checkpoint).
models::LlamaConfig LlamaConfigOf(const config::Config& c);

}  // namespace tessel::train
