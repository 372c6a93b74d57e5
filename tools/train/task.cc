#include "tools/train/task.h"

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "layers/optimizer.h"
#include "sbp/slice.h"

namespace tessel::train {

BatchLayout BatchLayout::ForWorld(int64_t rows) {
  return {.rows = rows,
          .dp = dist::GetConfig().data_parallel_size,
          .first = dist::GetLayerPlacement(0),
          .last = dist::GetLayerPlacement(-1),
          .sequence_split = dist::SequencesSplitOverDataParallel()};
}

std::pair<int64_t, int64_t> BatchLayout::SequenceRange(int64_t seq) const {
  if (!sequence_split) return {0, seq};
  // The part of dimension 1 that S(1) over dp gives this rank.
  const Range part = BalancedPart({0, seq}, dp, DataParallelIndex());
  return {part.begin, part.end};
}

int BatchLayout::DataParallelIndex() const { return static_cast<int>(dist::AxisRank("dp")); }

int64_t BatchLayout::FirstRow(int part, int parts) const {
  return (sequence_split ? 0 : DataParallelIndex() * (rows / dp)) + part * LocalRows(parts);
}

bool BatchLayout::ReadsInputs() const { return first.Contains(dist::Rank()); }
bool BatchLayout::ReadsLabels() const { return last.Contains(dist::Rank()); }

Tensor BatchLayout::OnFirst(const Tensor& local, const Shape& global_shape) const {
  return FromLocal(local, first, dist::BatchInputSbp(global_shape.ndim()), global_shape);
}
Tensor BatchLayout::OnLast(const Tensor& local, const Shape& global_shape) const {
  return FromLocal(local, last, dist::BatchInputSbp(global_shape.ndim()), global_shape);
}

void CheckTokenIds(const zoo::IndexedDataset& corpus, const config::Config& c) {
  const int64_t max_token = corpus.MaxToken();
  TESSEL_CHECK(max_token < c.model().vocab_size())
      << "tessel-train: dataset " << corpus.prefix() << " holds token id " << max_token
      << " but model.vocab_size is " << c.model().vocab_size()
      << "; expected a vocabulary larger than every id";
}

void CheckValidationDocuments(const std::vector<zoo::DocumentRange>& splits, size_t documents,
                              const config::Config& c) {
  TESSEL_CHECK(!c.evaluation().enabled() || splits[1].size() > 0)
      << "tessel-train: data.split '" << c.data().split() << "' gives the validation split no documents of "
      << documents << "; give it a share or set evaluation.enabled false";
}

double MeanEvaluationLoss(bool graph_mode, int64_t batches, int micro_batches, Graph& eval_step,
                          nn::Module& model, const std::function<Graph::Tensors(int64_t, int, int)>& read,
                          const std::function<Tensor(const Graph::Tensors&)>& loss) {
  double total = 0;
  for (int64_t k = 0; k < batches; ++k) {
    if (graph_mode) {
      total += optim::ScalarValue(eval_step(read(k, 0, 1)).at("loss"));
      continue;
    }
    NoGradGuard no_grad;
    model.Eval();
    double batch = 0;
    for (int part = 0; part < micro_batches; ++part)
      batch += optim::ScalarValue(loss(read(k, part, micro_batches)));
    total += batch / micro_batches;
    model.Train();
  }
  return total / static_cast<double>(batches);
}

}  // namespace tessel::train
