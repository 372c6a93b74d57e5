// Hugging Face models in and out: GPT2LMHeadModel, LlamaForCausalLM,
// T5ForConditionalGeneration, BertForPreTraining and
// ViTForImageClassification, as `save_pretrained` writes them (config.json
// and model.safetensors, or model.safetensors.index.json and its shards)
// and as `from_pretrained` reads them.
//
// tessel's parameters differ from Hugging Face's in names and in these
// layouts, mapped both ways by one table per model:
//   - Linear weights are [in, out] in tessel, as in GPT-2's Conv1D, but
//     [out, in] in nn.Linear (Llama, T5, BERT, ViT): transposed;
//   - the fused QKV weight is head-major in tessel ([head][q|k|v][head
//     dim], so a column split keeps heads whole), [q|k|v][head][head dim]
//     in GPT-2's c_attn, three separate Linears in BERT and ViT; Llama's
//     and T5's separate q, k, v go in per key/value group ([group][its
//     query heads|k|v][head dim]; T5's cross-attention k, v as [head][k|v]
//     [head dim]), and their gated MLPs' two input Linears interleave per
//     feature ([ffn][gate|up]);
//   - ViT's patch projection is a Linear over (channel, row, column)
//     patches in tessel, a Conv2d [hidden, C, p, p] there.
// The vocabulary is stored unpadded (tessel pads its table to a multiple of
// 128 x tp in memory; a checkpoint load fills the real rows).
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "zoo/config.pb.h"

namespace tessel::checkpoint {

// The model fields of a tessel config a Hugging Face config.json (its text)
// stands for. Throws naming `where` and the field for a model_type other
// than gpt2, llama, t5, bert or vit, or an option tessel's model does not have (an
// activation, cross-attention, relative positions, GPT-2 with untied
// embeddings...).
// Dropout probabilities are not carried over: they are a training choice
// (and graph mode trains without dropout).
config::ModelConfig ModelFromHuggingFaceConfig(const std::string& config_json, const std::string& where);
// config.json for `model` (arch gpt2, llama, t5, bert or vit), as from_pretrained reads it.
// eos_token_id: a T5's end-of-sequence id (data.eos_token_id; left out,
// T5's 1), which generate() stops at.
std::string HuggingFaceConfigJson(const config::ModelConfig& model,
                                  std::optional<int64_t> eos_token_id = std::nullopt);

struct HuggingFaceImport {
  config::ModelConfig model;
  // Every parameter of the model, whole, on the host, under tessel's names
  // (as NamedParameters gives them) and layouts; vocabulary rows unpadded.
  std::vector<std::pair<std::string, Tensor>> tensors;
};
// Reads the Hugging Face model in `dir`. Every tensor the model needs must
// be there with the shape its config implies, and every tensor there must
// be one the mapping uses or a known derived one (tied LM heads, attention
// mask buffers); anything else is an error naming the file and tensor.
HuggingFaceImport ReadHuggingFace(const std::filesystem::path& dir);

// Writes `model` as a Hugging Face model directory (config.json and
// model.safetensors with metadata format "pt"). `tensor(name)` gives the
// whole host tensor of a tessel parameter (a padded vocabulary is cut to
// model.vocab_size rows); it is called as each is written, so the writer
// holds one parameter at a time.
void WriteHuggingFace(const std::filesystem::path& dir, const config::ModelConfig& model,
                      const std::function<Tensor(const std::string& name)>& tensor,
                      std::optional<int64_t> eos_token_id = std::nullopt);

// The names of the tessel parameters the mapping of `model` covers (what
// ReadHuggingFace returns and WriteHuggingFace asks for).
std::vector<std::string> HuggingFaceMappedParameters(const config::ModelConfig& model);

}  // namespace tessel::checkpoint
