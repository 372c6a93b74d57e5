// Builds the GPT-2 of models/gpt.h under the launch's layout (--tp, --pp; dp
// derived), gives every parameter non-trivial values that are the same
// logical numbers under every layout, runs two forwards and writes from
// rank 0 a safetensors file (--out) with the parameters (gathered, under
// their tessel names), the inputs and the outputs:
//   input_ids, labels            [batch, seq]   labels[t] = ids[t+1], -100 last
//   logits, loss                 plain forward
//   position_ids, attention_mask [batch, seq]   row r: positions r.., its last r keys padding
//   masked_logits                forward with both
//   grad.<name>, step_loss.<k>   every gradient of the loss, 5 AdamW steps (DumpTraining)
// test_hf_gpt2.py loads it into Hugging Face's GPT2LMHeadModel and compares.
#include <gflags/gflags.h>

#include <cstdio>
#include <functional>
#include <string>

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "graph/init.h"
#include "layers/dist.h"
#include "models/gpt.h"
#include "ops/functional.h"
#include "tests/dist/hf_dump_init.h"
#include "zoo/safetensors.h"

DEFINE_int64(tp, 1, "tensor parallel size");
DEFINE_int64(pp, 1, "pipeline parallel size");
DEFINE_int64(vocab, 1100, "vocabulary size (padded to 128 x tp inside the model)");
DEFINE_int64(hidden, 32, "hidden size");
DEFINE_int64(heads, 4, "attention heads");
DEFINE_int64(layers, 2, "transformer layers");
DEFINE_int64(seq, 16, "sequence length (and max_seq)");
DEFINE_int64(batch, 3, "batch rows");
DEFINE_string(out, "", "safetensors file to write (rank 0)");
DEFINE_string(load, "", "a checkpoint whose model weights to use instead of the model's draws plus noise");

using namespace tessel;

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  dist::Setup({.tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = FLAGS_layers});
  models::GPT gpt({.vocab_size = FLAGS_vocab,
                   .hidden = FLAGS_hidden,
                   .heads = FLAGS_heads,
                   .layers = FLAGS_layers,
                   .max_seq = FLAGS_seq,
                   .activation = layers::Activation::kGeluTanh});
  gpt.Eval();
  testing::DumpOutputs keep;  // every rank takes part in each move to rank 0; only rank 0 keeps it
  testing::InitDumpParameters(gpt, 9000, 0.05, FLAGS_load, {{"wte.weight", FLAGS_vocab}});
  for (auto& [name, t] : gpt.NamedParameters()) keep("param." + name, *t);
  const testing::CausalLmInputs in = testing::MakeCausalLmInputs(FLAGS_batch, FLAGS_seq, FLAGS_vocab, keep);
  {
    NoGradGuard no_grad;
    keep("logits", gpt.Logits(in.ids));
    keep("loss", gpt.Loss(in.ids, in.labels));
    keep("masked_logits", gpt.Logits(in.ids, in.positions, in.mask));
  }
  testing::DumpTraining(
      gpt, [&] { return gpt.Loss(in.ids, in.labels); }, keep);
  if (dist::Rank() == 0) {
    zoo::WriteSafetensors(FLAGS_out, keep.tensors,
                          {{"vocab_size", std::to_string(FLAGS_vocab)},
                           {"padded_vocab_size", std::to_string(gpt.padded_vocab_size())},
                           {"hidden_size", std::to_string(FLAGS_hidden)},
                           {"num_attention_heads", std::to_string(FLAGS_heads)},
                           {"hidden_layers", std::to_string(FLAGS_layers)},
                           {"max_seq_length", std::to_string(FLAGS_seq)}});
    std::printf("wrote %zu tensors to %s (tp %ld, pp %ld, vocab %ld padded to %ld)\n", keep.tensors.size(),
                FLAGS_out.c_str(), static_cast<long>(FLAGS_tp), static_cast<long>(FLAGS_pp),
                static_cast<long>(FLAGS_vocab), static_cast<long>(gpt.padded_vocab_size()));
  }
  return 0;
}
