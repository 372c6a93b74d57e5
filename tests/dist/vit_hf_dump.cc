// Builds the ViT of models/vit.h under the launch's layout (--tp, --pp; dp
// derived), gives every parameter non-trivial values that are the same
// logical numbers under every layout, runs a forward and writes from rank 0
// a safetensors file (--out) with the parameters (gathered, under their
// tessel names), the inputs and the outputs:
//   pixel_values [batch, channels, size, size], labels [batch]
//   logits [batch, classes], loss
//   grad.<name>, step_loss.<k>   every gradient of the loss, 5 AdamW steps (DumpTraining)
// test_hf_vit.py loads it into Hugging Face's ViTForImageClassification and
// compares.
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <cstdio>
#include <string>

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "models/vit.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "tests/dist/hf_dump_init.h"
#include "zoo/safetensors.h"

DEFINE_int64(tp, 1, "tensor parallel size");
DEFINE_int64(pp, 1, "pipeline parallel size");
DEFINE_int64(image_size, 16, "image height and width");
DEFINE_int64(patch, 4, "patch size");
DEFINE_int64(channels, 3, "image channels");
DEFINE_int64(classes, 7, "classes");
DEFINE_int64(hidden, 32, "hidden size");
DEFINE_int64(heads, 4, "attention heads");
DEFINE_int64(layers, 2, "transformer layers");
DEFINE_int64(batch, 3, "images");
DEFINE_string(out, "", "safetensors file to write (rank 0)");
DEFINE_string(load, "", "a checkpoint whose model weights to use instead of the model's draws plus noise");

using namespace tessel;

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  dist::Setup({.tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = FLAGS_layers});
  // Hugging Face's ViTConfig defaults: exact GELU, epsilon 1e-12.
  models::ViT vit({.image_size = FLAGS_image_size,
                   .patch_size = FLAGS_patch,
                   .num_channels = FLAGS_channels,
                   .num_classes = FLAGS_classes,
                   .hidden = FLAGS_hidden,
                   .heads = FLAGS_heads,
                   .layers = FLAGS_layers,
                   .layernorm_epsilon = 1e-12,
                   .activation = layers::Activation::kGelu});
  vit.Eval();
  testing::DumpOutputs keep;
  testing::InitDumpParameters(vit, 7000, 0.1, FLAGS_load);
  for (auto& [name, t] : vit.NamedParameters()) keep("param." + name, *t);
  const int64_t b = FLAGS_batch;
  const Tensor pixels = randn({b, FLAGS_channels, FLAGS_image_size, FLAGS_image_size}, 99);
  std::vector<int64_t> labels(b);
  for (int64_t i = 0; i < b; ++i) labels[i] = (3 * i + 1) % FLAGS_classes;
  const Tensor labels_t = Tensor::FromVector<int64_t>(labels, {b});
  {
    NoGradGuard no_grad;
    keep("pixel_values", pixels);
    keep("labels", labels_t);
    keep("logits", vit.Logits(pixels));
    keep("loss", vit.Loss(pixels, labels_t));
  }
  testing::DumpTraining(
      vit, [&] { return vit.Loss(pixels, labels_t); }, keep);
  if (dist::Rank() == 0) {
    zoo::WriteSafetensors(FLAGS_out, keep.tensors,
                          {{"image_size", std::to_string(FLAGS_image_size)},
                           {"patch_size", std::to_string(FLAGS_patch)},
                           {"num_channels", std::to_string(FLAGS_channels)},
                           {"num_classes", std::to_string(FLAGS_classes)},
                           {"hidden_size", std::to_string(FLAGS_hidden)},
                           {"num_attention_heads", std::to_string(FLAGS_heads)},
                           {"hidden_layers", std::to_string(FLAGS_layers)}});
    std::printf("wrote %zu tensors to %s (tp %ld, pp %ld)\n", keep.tensors.size(), FLAGS_out.c_str(),
                static_cast<long>(FLAGS_tp), static_cast<long>(FLAGS_pp));
  }
  return 0;
}
