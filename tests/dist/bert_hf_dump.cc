// Builds the BERT of models/bert.h under the launch's layout (--tp, --pp;
// dp derived), gives every parameter non-trivial values that are the same
// logical numbers under every layout, runs two forwards and writes from
// rank 0 a safetensors file (--out) with the parameters (gathered, under
// their tessel names), the inputs and the outputs:
//   input_ids, token_type_ids, attention_mask  [batch, seq]
//   mlm_labels [batch, seq] (-100 but every third position), sentence_labels [batch]
//   plain_mlm_logits, plain_sentence_logits    forward on the ids alone
//   mlm_logits, sentence_logits, loss          forward with every input
//   weighted_loss                              the same loss as tessel-train weighs it
// and a sequence classifier of 3 classes (num_labels 3): its parameters
// (cls_param.*), class_labels [batch], class_logits and class_loss; then
// grad.<name> and step_loss.<k>: every gradient of the pre-training loss
// and 5 AdamW steps (DumpTraining). Padded positions hold [PAD] (id 0).
// test_hf_bert.py loads them into Hugging Face's BertForPreTraining and
// BertForSequenceClassification and compares.
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <cstdio>
#include <string>

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "models/bert.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
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
  // Hugging Face's BertConfig defaults: exact GELU, epsilon 1e-12.
  models::Bert bert({.vocab_size = FLAGS_vocab,
                     .hidden = FLAGS_hidden,
                     .heads = FLAGS_heads,
                     .layers = FLAGS_layers,
                     .max_seq = FLAGS_seq});
  bert.Eval();
  testing::DumpOutputs keep;
  testing::InitDumpParameters(bert, 5000, 0.05, FLAGS_load,
                              {{"word_embeddings.weight", FLAGS_vocab}, {"mlm_bias", FLAGS_vocab}});
  for (auto& [name, t] : bert.NamedParameters()) keep("param." + name, *t);
  const int64_t b = FLAGS_batch, s = FLAGS_seq;
  std::vector<int64_t> ids(b * s), types(b * s), mlm_labels(b * s), sentence_labels(b);
  std::vector<bool> attend(b * s);
  for (int64_t r = 0; r < b; ++r) {
    sentence_labels[r] = r % 2;
    for (int64_t t = 0; t < s; ++t) {
      const int64_t i = r * s + t;
      types[i] = t < s / 2 ? 0 : 1;
      attend[i] = t < s - r;  // row r: its last r keys are padding, [PAD] (0) tokens
      ids[i] = attend[i] ? 1 + (i * 7919 + 13) % (FLAGS_vocab - 1) : 0;
      mlm_labels[i] = t % 3 == 1 && attend[i] ? (i * 31 + 7) % FLAGS_vocab : -100;
    }
  }
  const Tensor ids_t = Tensor::FromVector<int64_t>(ids, {b, s});
  const Tensor types_t = Tensor::FromVector<int64_t>(types, {b, s});
  const Tensor mask_t = Tensor::FromVector<bool>(attend, {b, s});
  const Tensor mlm_t = Tensor::FromVector<int64_t>(mlm_labels, {b, s});
  const Tensor sentence_t = Tensor::FromVector<int64_t>(sentence_labels, {b});
  {
    NoGradGuard no_grad;
    keep("input_ids", ids_t);
    keep("token_type_ids", types_t);
    keep("attention_mask", mask_t);
    keep("mlm_labels", mlm_t);
    keep("sentence_labels", sentence_t);
    const models::BertOutputs plain = bert.Forward(ids_t);
    keep("plain_mlm_logits", plain.mlm_logits);
    keep("plain_sentence_logits", plain.sentence_logits);
    const models::BertOutputs full = bert.Forward(ids_t, types_t, mask_t);
    keep("mlm_logits", full.mlm_logits);
    keep("sentence_logits", full.sentence_logits);
    keep("loss", bert.Loss(ids_t, types_t, mask_t, mlm_t, sentence_t));
    // tessel-train's form: each labelled position weighs 1 / (labelled positions).
    int64_t labelled = 0;
    for (int64_t y : mlm_labels) labelled += y != -100;
    std::vector<float> weights(mlm_labels.size());
    for (size_t i = 0; i < weights.size(); ++i)
      weights[i] = mlm_labels[i] == -100 ? 0.0f : 1.0f / static_cast<float>(labelled);
    const models::BertLosses weighted = bert.WeightedLosses(
        ids_t, types_t, mask_t, mlm_t, Tensor::FromVector<float>(weights, {b, s}), sentence_t);
    keep("weighted_loss", fn::add(weighted.mlm, weighted.sentence));
    {
      // The sequence classifier: its own draws, the same inputs.
      models::Bert classifier({.vocab_size = FLAGS_vocab,
                               .hidden = FLAGS_hidden,
                               .heads = FLAGS_heads,
                               .layers = FLAGS_layers,
                               .max_seq = FLAGS_seq,
                               .seed = 77,
                               .num_labels = 3});
      classifier.Eval();
      testing::InitDumpParameters(classifier, 9000, 0.05, "");
      for (auto& [name, t] : classifier.NamedParameters()) keep("cls_param." + name, *t);
      std::vector<int64_t> classes(b);
      for (int64_t r = 0; r < b; ++r) classes[r] = (r * 2 + 1) % 3;
      const Tensor classes_t = Tensor::FromVector<int64_t>(classes, {b});
      keep("class_labels", classes_t);
      keep("class_logits", classifier.ClassificationLogits(ids_t, types_t, mask_t));
      keep("class_loss", classifier.ClassificationLoss(ids_t, types_t, mask_t, classes_t));
    }
  }
  testing::DumpTraining(
      bert, [&] { return bert.Loss(ids_t, types_t, mask_t, mlm_t, sentence_t); }, keep);
  if (dist::Rank() == 0) {
    zoo::WriteSafetensors(FLAGS_out, keep.tensors,
                          {{"vocab_size", std::to_string(FLAGS_vocab)},
                           {"padded_vocab_size", std::to_string(bert.padded_vocab_size())},
                           {"hidden_size", std::to_string(FLAGS_hidden)},
                           {"num_attention_heads", std::to_string(FLAGS_heads)},
                           {"hidden_layers", std::to_string(FLAGS_layers)},
                           {"max_seq_length", std::to_string(FLAGS_seq)}});
    std::printf("wrote %zu tensors to %s (tp %ld, pp %ld, vocab %ld padded to %ld)\n", keep.tensors.size(),
                FLAGS_out.c_str(), static_cast<long>(FLAGS_tp), static_cast<long>(FLAGS_pp),
                static_cast<long>(FLAGS_vocab), static_cast<long>(bert.padded_vocab_size()));
  }
  return 0;
}
