// Builds the T5 of models/t5.h under the launch's layout (--tp, --pp; dp
// derived; layers encoder first, then decoder), gives every parameter
// non-trivial values that are the same logical numbers under every layout,
// and writes from rank 0 a safetensors file (--out) with the parameters
// (gathered, under their tessel names), the inputs and the outputs:
//   input_ids [batch, seq], decoder_input_ids and labels [batch, target]
//   attention_mask [batch, seq]   row r: its last r encoder tokens padding
//   logits, loss                  without the mask
//   masked_logits, masked_loss    with it
//   grad.<name>, step_loss.<k>    every gradient of the masked loss, 5 AdamW steps
// test_hf_t5.py loads it into Hugging Face's T5ForConditionalGeneration.
#include <gflags/gflags.h>

#include <cstdio>
#include <string>

#include "graph/autograd.h"
#include "graph/init.h"
#include "layers/dist.h"
#include "models/t5.h"
#include "tests/dist/hf_dump_init.h"
#include "zoo/safetensors.h"

DEFINE_int64(tp, 1, "tensor parallel size");
DEFINE_int64(pp, 1, "pipeline parallel size");
DEFINE_int64(vocab, 1100, "vocabulary size (padded to 128 x tp inside the model)");
DEFINE_int64(hidden, 64, "d_model");
DEFINE_int64(heads, 4, "attention heads");
DEFINE_int64(head_dim, 16, "d_kv");
DEFINE_int64(ffn, 96, "d_ff");
DEFINE_int64(encoder_layers, 2, "encoder layers");
DEFINE_int64(decoder_layers, 2, "decoder layers");
DEFINE_int64(buckets, 8, "relative-position buckets");
DEFINE_int64(max_distance, 20, "relative-position distance of the last bucket");
DEFINE_int64(seq, 16, "encoder tokens");
DEFINE_int64(target, 12, "decoder tokens");
DEFINE_int64(batch, 3, "batch rows");
DEFINE_bool(tie, false, "tie the output to the token table (the original T5's scaling)");
DEFINE_bool(gated, true, "T5 v1.1's gated-GELU feed-forward (else ReLU)");
DEFINE_string(out, "", "safetensors file to write (rank 0)");
DEFINE_string(load, "", "a checkpoint whose model weights to use instead of the model's draws plus noise");

using namespace tessel;

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  dist::Setup({.tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = FLAGS_encoder_layers + FLAGS_decoder_layers});
  models::T5 t5({.vocab_size = FLAGS_vocab,
                 .hidden = FLAGS_hidden,
                 .heads = FLAGS_heads,
                 .head_dim = FLAGS_head_dim,
                 .ffn_hidden = FLAGS_ffn,
                 .encoder_layers = FLAGS_encoder_layers,
                 .decoder_layers = FLAGS_decoder_layers,
                 .relative_buckets = FLAGS_buckets,
                 .relative_max_distance = FLAGS_max_distance,
                 .gated_gelu = FLAGS_gated,
                 .tie_word_embeddings = FLAGS_tie});
  t5.Eval();
  testing::DumpOutputs keep;  // every rank takes part in each move to rank 0; only rank 0 keeps it
  std::map<std::string, int64_t> padded = {{"shared.weight", FLAGS_vocab}};
  if (!FLAGS_tie) padded["lm_head.weight"] = FLAGS_vocab;
  testing::InitDumpParameters(t5, 9000, 0.05, FLAGS_load, padded);
  for (auto& [name, t] : t5.NamedParameters()) keep("param." + name, *t);
  const int64_t b = FLAGS_batch, s = FLAGS_seq, n = FLAGS_target;
  std::vector<int64_t> ids(b * s), labels(b * n);
  std::vector<bool> attend(b * s);
  for (int64_t i = 0; i < b * s; ++i) ids[i] = (i * 7919 + 13) % FLAGS_vocab;
  for (int64_t i = 0; i < b * n; ++i)
    labels[i] = i % n == n - 1 && i / n == 1 ? -100 : (i * 104729 + 7) % FLAGS_vocab;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t) attend[r * s + t] = t < s - r;  // row r: its last r tokens are padding
  const Tensor ids_t = Tensor::FromVector<int64_t>(ids, {b, s});
  const Tensor labels_t = Tensor::FromVector<int64_t>(labels, {b, n});
  const Tensor decoder_t = Tensor::FromVector<int64_t>(models::T5::ShiftRight(labels, n), {b, n});
  const Tensor mask_t = Tensor::FromVector<bool>(attend, {b, s});
  {
    NoGradGuard no_grad;
    keep("input_ids", ids_t);
    keep("labels", labels_t);
    keep("decoder_input_ids", decoder_t);
    keep("attention_mask", mask_t);
    keep("logits", t5.Logits(ids_t, decoder_t));
    keep("loss", t5.Loss(ids_t, decoder_t, labels_t));
    keep("masked_logits", t5.Logits(ids_t, decoder_t, mask_t));
    keep("masked_loss", t5.Loss(ids_t, decoder_t, labels_t, mask_t));
  }
  testing::DumpTraining(
      t5, [&] { return t5.Loss(ids_t, decoder_t, labels_t, mask_t); }, keep);
  if (dist::Rank() == 0) {
    zoo::WriteSafetensors(FLAGS_out, keep.tensors,
                          {{"vocab_size", std::to_string(FLAGS_vocab)},
                           {"padded_vocab_size", std::to_string(t5.padded_vocab_size())},
                           {"d_model", std::to_string(FLAGS_hidden)},
                           {"num_heads", std::to_string(FLAGS_heads)},
                           {"d_kv", std::to_string(FLAGS_head_dim)},
                           {"d_ff", std::to_string(FLAGS_ffn)},
                           {"num_layers", std::to_string(FLAGS_encoder_layers)},
                           {"num_decoder_layers", std::to_string(FLAGS_decoder_layers)},
                           {"relative_attention_num_buckets", std::to_string(FLAGS_buckets)},
                           {"relative_attention_max_distance", std::to_string(FLAGS_max_distance)},
                           {"tie_word_embeddings", FLAGS_tie ? "true" : "false"},
                           {"feed_forward_proj", FLAGS_gated ? "gated-gelu" : "relu"}});
    std::printf("wrote %zu tensors to %s (tp %ld, pp %ld)\n", keep.tensors.size(), FLAGS_out.c_str(),
                static_cast<long>(FLAGS_tp), static_cast<long>(FLAGS_pp));
  }
  return 0;
}
