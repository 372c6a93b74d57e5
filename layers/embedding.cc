#include "layers/embedding.h"

#include <glog/logging.h>

#include <algorithm>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::layers {

namespace {
// `table` with row `row` zeroed (a padding token's row, as torch.nn.Embedding
// initialises it), in the table's layout.
Tensor ZeroRow(const Tensor& table, int64_t row) {
  const int64_t rows = table.shape()[0];
  TESSEL_CHECK(row < rows) << "padding_idx " << row << " is outside the embedding table's " << rows
                           << " rows";
  const NdSbp replicated = dist::GetNdSbp({B(), B()});
  const Tensor index = arange({rows, 1}, table.placement(), replicated);
  const Tensor is_row =
      fn::equal(index, full({rows, 1}, static_cast<double>(row), table.placement(), replicated));
  return fn::masked_fill(table, is_row, 0.0).to_global(table.placement(), table.nd_sbp());
}
}  // namespace

VocabEmbedding::VocabEmbedding(int64_t vocab_size, int64_t hidden, EmbeddingOptions options)
    : padding_idx_(options.padding_idx) {
  // The vocabulary is split like a column layer's output features: over
  // tp (1d), or one side of the multi-axis modes' mesh.
  const int64_t parts = dist::ColumnFeatureParts();
  const bool over_tp = !dist::MultiAxisTensorParallel();
  TESSEL_CHECK(vocab_size % parts == 0)
      << "VocabEmbedding: vocab_size=" << vocab_size << " is not divisible by "
      << (over_tp ? "tensor_parallel_size="
                  : "the vocabulary's split of tensor_parallel_mode '" +
                        dist::GetConfig().tensor_parallel_mode + "': ")
      << parts << "; pad the vocabulary to a multiple of " << parts;
  NoGradGuard no_grad;
  // Split on the vocabulary over tp (1d), or the column layout's weight
  // transposed (the multi-axis modes, so the tied LM head is a column layer).
  const Shape shape({vocab_size, hidden});
  const NdSbp layout =
      dist::MultiAxisTensorParallel() ? dist::MultiAxisEmbeddingLayouts().table : dist::GetNdSbp({B(), S(0)});
  weight = fn::mul_scalar(randn(shape, dist::GetLayerPlacement(options.layer_idx),
                                dist::GetParameterNdSbp(shape, layout), options.seed),
                          options.init_std);
  if (padding_idx_ >= 0) weight = ZeroRow(weight, padding_idx_);
  RegisterParameter("weight", weight);
}

Tensor VocabEmbedding::operator()(const Tensor& ids) const {
  const Placement& p = weight.placement();
  // ids: batch split over dp, replicated over tp; the lookup gives partial
  // sums over tp, reduced into the hidden layout.
  Tensor g = ToHidden(ids, p);
  if (dist::MultiAxisTensorParallel()) {
    // The table gathered to the lookup's layout: where it is split on the
    // vocabulary the lookup gives partial sums, reduce-scattered on the
    // batch or the features into the hidden states' layout.
    const dist::EmbeddingLayouts l = dist::MultiAxisEmbeddingLayouts();
    return fn::embedding(GatheredForCompute(ForCompute(weight), l.table_compute), g.to_global(p, l.ids),
                         padding_idx_)
        .to_global(p, dist::GetActivationSbp(g.ndim() + 1));
  }
  // Under sequence parallelism reduce-scattered on the sequence, its
  // gradient all-gathered back: each rank then computes its rows' gradient
  // alone, as without it, instead of a partial gradient of the whole table.
  return fn::embedding(ForCompute(weight), g, padding_idx_)
      .to_global(p, dist::GetActivationSbp(g.ndim() + 1), dist::GetHiddenSbp());
}

Embedding::Embedding(int64_t num_embeddings, int64_t hidden, EmbeddingOptions options)
    : padding_idx_(options.padding_idx) {
  NoGradGuard no_grad;
  weight = fn::mul_scalar(randn({num_embeddings, hidden}, dist::GetLayerPlacement(options.layer_idx),
                                dist::GetParameterNdSbp(Shape({num_embeddings, hidden}), B()), options.seed),
                          options.init_std);
  if (padding_idx_ >= 0) weight = ZeroRow(weight, padding_idx_);
  RegisterParameter("weight", weight);
}

Tensor Embedding::operator()(const Tensor& ids) const {
  // Replicated table and ids (positions are shared by the whole batch).
  const Placement& p = weight.placement();
  const NdSbp all_b = dist::GetNdSbp({B(), B()});
  // A local ids tensor is the whole value on every rank (no exchange).
  const Tensor laid = ids.is_global() ? ids.to_global(p, all_b) : FromLocal(ids, p, all_b, ids.shape());
  return fn::embedding(ForCompute(weight), laid, padding_idx_);
}

int64_t PaddedVocabSize(int64_t vocab_size, int64_t multiple, int64_t tp) {
  TESSEL_CHECK(vocab_size > 0) << "vocab_size=" << vocab_size << "; expected a positive size";
  const int64_t unit = std::max<int64_t>(multiple, 1) * tp;
  return (vocab_size + unit - 1) / unit * unit;
}

int64_t PaddedVocabSizeLogged(const std::string& model, int64_t vocab_size, int64_t multiple) {
  const int64_t parts = dist::ColumnFeatureParts();
  const int64_t padded = PaddedVocabSize(vocab_size, multiple, parts);
  if (padded != vocab_size && dist::Rank() == 0)
    LOG(INFO) << model << ": vocabulary of " << vocab_size << " padded to " << padded
              << " rows (a multiple of " << std::max<int64_t>(multiple, 1) << " x " << parts
              << (parts == dist::GetConfig().tensor_parallel_size ? " (tp)" : " (the vocabulary's split)")
              << "); the padded logits are masked out";
  return padded;
}

}  // namespace tessel::layers
