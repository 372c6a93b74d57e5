// Runs every parallel layer once (forward, and backward of sum(y * r)) under
// the launch's layout (--tp; dp derived) and writes, from rank 0, each
// layer's gathered output, input gradient and parameter gradients to --out
// as text ("name count" then the values). test_layer_layouts.py compares the
// files of several layouts with the single-process one.
#include <gflags/gflags.h>

#include <cstdio>
#include <fstream>
#include <functional>

#include "core/comm/process_group.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "graph/init.h"
#include "layers/dist.h"
#include "layers/embedding.h"
#include "layers/transformer.h"
#include "ops/functional.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

DEFINE_int64(tp, 1, "tensor parallel size");
DEFINE_string(out, "", "file to write (rank 0)");

using namespace tessel;

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  dist::Setup({.tensor_parallel_size = FLAGS_tp});
  const Placement p = dist::GetLayerPlacement(0);
  const int64_t batch = 4, seq = 5, hidden = 8, heads = 4, vocab = 12;
  std::ofstream out;
  if (dist::Rank() == 0) out.open(FLAGS_out);
  auto dump = [&](const std::string& name, const Tensor& t) {
    Tensor v = GatherLogical(t.detach());
    if (dist::Rank() != 0) return;
    std::vector<float> values = v.ToVector<float>();
    out << name << " " << values.size() << "\n";
    for (float x : values) out << x << " ";
    out << "\n";
  };
  auto check = [&](const std::string& name, nn::Module& m, const Tensor& input,
                   const std::function<Tensor(const Tensor&)>& forward) {
    // Non-trivial parameters, the same logical values under every layout.
    uint64_t seed = std::hash<std::string>{}(name) % 100000;
    {
      NoGradGuard no_grad;
      for (auto& [n, t] : m.NamedParameters()) {
        *t = fn::mul_scalar(randn(t->shape(), t->placement(), t->nd_sbp(), seed++), 0.5)
                 .set_requires_grad(true);
      }
    }
    Tensor y = forward(input);
    Tensor r = randn(y.shape(), y.placement(), NdSbp(std::vector<Sbp>(y.placement().ndim(), B())), 777);
    fn::sum(fn::mul(y, r), {}).backward();
    dump(name + ".output", y);
    if (input.requires_grad()) dump(name + ".input_grad", input.grad());
    for (auto& [n, t] : m.NamedParameters()) dump(name + "." + n + ".grad", t->grad());
  };

  std::vector<int64_t> idv(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) idv[i] = (i * 5 + 3) % vocab;
  Tensor id_t = Tensor::FromVector<int64_t>(idv, {batch, seq});
  auto x = [&] { return randn({batch, seq, hidden}, p, dist::GetHiddenSbp(), 9).set_requires_grad(true); };

  layers::VocabEmbedding embedding(vocab, hidden, {.seed = 1});
  check("vocab_embedding", embedding, id_t, [&](const Tensor& in) { return embedding(in); });
  layers::MultiheadAttention attention(hidden, heads, {.causal = true, .seed = 2});
  check("attention", attention, x(), [&](const Tensor& in) { return attention(in); });
  layers::MLP mlp(hidden, 16, 0, 3);
  check("mlp", mlp, x(), [&](const Tensor& in) { return mlp(in); });
  layers::TransformerLayer block(hidden, heads, 16, {.seed = 4});
  check("transformer_layer", block, x(), [&](const Tensor& in) { return block(in); });
  layers::VocabEmbedding table(vocab, hidden, {.seed = 5});
  check("lm_logits_loss", table, x(), [&](const Tensor& in) {
    return layers::ParallelCrossEntropyLoss(layers::LMLogits(in, table.weight), id_t);
  });
  if (dist::Rank() == 0) std::printf("dumped 5 layers under tp=%ld\n", static_cast<long>(FLAGS_tp));
  return 0;
}
