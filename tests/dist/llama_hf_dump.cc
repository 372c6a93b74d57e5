// Builds the Llama of models/llama.h under the launch's layout (--tp, --pp;
// dp derived), gives every parameter non-trivial values that are the same
// logical numbers under every layout, and writes from rank 0 a safetensors
// file (--out) with the parameters (gathered, under their tessel names),
// the inputs and the outputs, as gpt2_hf_dump does:
//   input_ids, labels            [batch, seq]   labels[t] = ids[t+1], -100 last
//   logits, loss                 plain forward
//   position_ids, attention_mask [batch, seq]   row r: positions r.., its last r keys padding
//   masked_logits                forward with both
//   grad.<name>, step_loss.<k>   every gradient of the loss, 5 AdamW steps (DumpTraining)
// test_hf_llama.py loads it into Hugging Face's LlamaForCausalLM and compares.
#include <gflags/gflags.h>

#include <cstdio>
#include <string>

#include "graph/autograd.h"
#include "graph/init.h"
#include "layers/dist.h"
#include "models/llama.h"
#include "tests/dist/hf_dump_init.h"
#include "zoo/safetensors.h"

DEFINE_int64(tp, 1, "tensor parallel size");
DEFINE_int64(pp, 1, "pipeline parallel size");
DEFINE_int64(vocab, 1100, "vocabulary size (padded to 128 x tp inside the model)");
DEFINE_int64(hidden, 64, "hidden size");
DEFINE_int64(heads, 8, "attention heads");
DEFINE_int64(kv_heads, 2, "key/value heads (grouped-query attention)");
DEFINE_int64(ffn, 96, "MLP inner size");
DEFINE_int64(layers, 2, "decoder layers");
DEFINE_int64(seq, 16, "sequence length (and max_seq)");
DEFINE_int64(batch, 3, "batch rows");
DEFINE_double(rope_theta, 10000, "rotary base");
DEFINE_bool(tie, false, "tie the output projection to the embedding");
DEFINE_string(out, "", "safetensors file to write (rank 0)");
DEFINE_string(load, "", "a checkpoint whose model weights to use instead of the model's draws plus noise");

using namespace tessel;

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  dist::Setup({.tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = FLAGS_layers});
  models::Llama llama({.vocab_size = FLAGS_vocab,
                       .hidden = FLAGS_hidden,
                       .heads = FLAGS_heads,
                       .kv_heads = FLAGS_kv_heads,
                       .layers = FLAGS_layers,
                       .ffn_hidden = FLAGS_ffn,
                       .max_seq = FLAGS_seq,
                       .rope = {.theta = FLAGS_rope_theta},
                       .tie_word_embeddings = FLAGS_tie});
  llama.Eval();
  testing::DumpOutputs keep;  // every rank takes part in each move to rank 0; only rank 0 keeps it
  std::map<std::string, int64_t> padded = {{"embed_tokens.weight", FLAGS_vocab}};
  if (!FLAGS_tie) padded["lm_head.weight"] = FLAGS_vocab;
  testing::InitDumpParameters(llama, 9000, 0.05, FLAGS_load, padded);
  for (auto& [name, t] : llama.NamedParameters()) keep("param." + name, *t);
  const testing::CausalLmInputs in = testing::MakeCausalLmInputs(FLAGS_batch, FLAGS_seq, FLAGS_vocab, keep);
  {
    NoGradGuard no_grad;
    keep("logits", llama.Logits(in.ids));
    keep("loss", llama.Loss(in.ids, in.labels));
    keep("masked_logits", llama.Logits(in.ids, in.positions, in.mask));
  }
  testing::DumpTraining(
      llama, [&] { return llama.Loss(in.ids, in.labels); }, keep);
  if (dist::Rank() == 0) {
    zoo::WriteSafetensors(FLAGS_out, keep.tensors,
                          {{"vocab_size", std::to_string(FLAGS_vocab)},
                           {"padded_vocab_size", std::to_string(llama.padded_vocab_size())},
                           {"hidden_size", std::to_string(FLAGS_hidden)},
                           {"num_attention_heads", std::to_string(FLAGS_heads)},
                           {"num_key_value_heads", std::to_string(FLAGS_kv_heads)},
                           {"intermediate_size", std::to_string(FLAGS_ffn)},
                           {"hidden_layers", std::to_string(FLAGS_layers)},
                           {"max_seq_length", std::to_string(FLAGS_seq)},
                           {"rope_theta", std::to_string(FLAGS_rope_theta)},
                           {"rms_norm_eps", "1e-05"},
                           {"tie_word_embeddings", FLAGS_tie ? "true" : "false"}});
    std::printf("wrote %zu tensors to %s (tp %ld, pp %ld, vocab %ld padded to %ld)\n", keep.tensors.size(),
                FLAGS_out.c_str(), static_cast<long>(FLAGS_tp), static_cast<long>(FLAGS_pp),
                static_cast<long>(FLAGS_vocab), static_cast<long>(llama.padded_vocab_size()));
  }
  return 0;
}
