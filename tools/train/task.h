// What tessel-train trains: a model with its data, behind one interface so
// the training loop (training_program.cc) is the same for every model. The
// zoo's, one file each: causal_lm_task.cc (GPT-2 and Llama, or a causal
// language model a program registered, on an indexed dataset), t5_task.cc
// (T5 by span corruption of one), bert_task.cc (BERT on an indexed dataset
// of sentences), vit_task.cc (ViT on an image dataset). A program adds its
// own with train::RegisterModel (tools/train/model_registry.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/plan/graph.h"
#include "layers/module.h"
#include "layers/transformer.h"
#include "sbp/placement.h"
#include "tools/train/model_config.h"
#include "zoo/config.pb.h"
#include "zoo/gpt_dataset.h"
#include "zoo/indexed_dataset.h"

namespace tessel::train {

// How a global batch reaches the ranks: each data-parallel rank reads its
// rows (rows / dp of them, cut again into micro-batches eagerly; or every
// row, but its part of each sequence, under all-to-all sequence
// parallelism); inputs go
// to the first stage's ranks and labels to the last's, so a rank of
// neither reads nothing.
struct BatchLayout {
  int64_t rows = 0;  // the global batch
  int64_t dp = 1;
  Placement first, last;
  // Under all-to-all sequence parallelism and context parallelism the dp
  // ranks share every row and each reads its part of the sequence.
  bool sequence_split = false;

  static BatchLayout ForWorld(int64_t rows);
  int DataParallelIndex() const;
  // Rows this rank reads for micro-batch `part` of `parts`.
  int64_t LocalRows(int parts) const { return rows / (sequence_split ? 1 : dp) / parts; }
  // The positions [first, second) of a `seq`-long sequence this rank reads.
  std::pair<int64_t, int64_t> SequenceRange(int64_t seq) const;
  // The position in the global batch of this rank's first row of `part`.
  int64_t FirstRow(int part, int parts) const;
  bool ReadsInputs() const;
  bool ReadsLabels() const;
  // This rank's rows (`local`; empty of shape [0, ...] off the placement) as
  // the global input of `global_shape` on the first (or last) stage, in
  // dist::BatchInputSbp.
  Tensor OnFirst(const Tensor& local, const Shape& global_shape) const;
  Tensor OnLast(const Tensor& local, const Shape& global_shape) const;
};

struct Metric {
  std::string name;  // "loss", "perplexity", "accuracy"
  double value;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual nn::Module& model() = 0;
  // The mean loss of a batch of this task's inputs (micro-batch or whole).
  virtual Tensor Loss(const Graph::Tensors& inputs) const = 0;
  // This rank's inputs for micro-batch `part` of `parts` of training
  // iteration `iteration`.
  virtual Graph::Tensors ReadTrain(int64_t iteration, int part, int parts) const = 0;
  // Evaluation over the validation split: the loss and the task's metric.
  // In graph mode it runs a forward-only graph (options: the training
  // graph's stages, micro-batches); eagerly, one micro-batch after another.
  // Every rank calls it; the figures need only be right on rank 0.
  virtual std::vector<Metric> Evaluate(bool graph_mode) = 0;
  // The names of Evaluate's metrics, in its order, "loss" first
  // (train.best_checkpoint_metric is one of them, "eval_" before it; a
  // name ending in "accuracy" is better higher, any other lower).
  virtual std::vector<std::string> MetricNames() const = 0;
  // Tokens in a sample, for tokens/s (a sequence's length, a ViT's patches).
  virtual int64_t tokens_per_sample() const = 0;
  // Model FLOPs of a training step on one sample, forward and backward (3x
  // the forward's), for TFLOP/s and MFU in the log: the matmuls and
  // attention's two products, as Megatron-LM and PaLM count them (no causal
  // halving, no recomputation).
  virtual double TrainFlopsPerSample() const = 0;
  // One line on the data for the start of the log.
  virtual std::string DataSummary() const = 0;
  // Parameters whose rows past a count are vocabulary padding (name -> the
  // real vocabulary), so a checkpoint loads under a tp that pads otherwise.
  virtual std::map<std::string, int64_t> PaddedRows() const { return {}; }
};

struct TaskContext {
  const config::Config& config;
  // Forward only: the training graph's stages and micro-batches, run under
  // the training schedule on actors of their own (in_order: the reference
  // executor).
  GraphOptions eval_graph;
  int micro_batches = 1;
};

// The config's checks of token data, shared by the language-model tasks:
// every id below model.vocab_size, and documents for the validation split
// when evaluation is on. Throw naming the field.
void CheckTokenIds(const zoo::IndexedDataset& corpus, const config::Config& c);
void CheckValidationDocuments(const std::vector<zoo::DocumentRange>& splits, size_t documents,
                              const config::Config& c);
// A language model's evaluation loss: the mean over `batches` batches, each
// through the forward-only graph `eval_step` (graph mode, its output
// "loss"), or eagerly one micro-batch after another with `model` in eval
// mode (no dropout) and no gradients. read(batch, part, parts) gives
// micro-batch `part` of `parts` of evaluation batch `batch`.
double MeanEvaluationLoss(bool graph_mode, int64_t batches, int micro_batches, Graph& eval_step,
                          nn::Module& model, const std::function<Graph::Tensors(int64_t, int, int)>& read,
                          const std::function<Tensor(const Graph::Tensors&)>& loss);

// Checks the data against the model's config and builds the model, before
// any training; throws naming the field or file. (GPT-2 and Llama are
// causal language models: model_registry.h.)
std::unique_ptr<Task> MakeT5Task(const TaskContext& context);
std::unique_ptr<Task> MakeBertTask(const TaskContext& context);
std::unique_ptr<Task> MakeViTTask(const TaskContext& context);

}  // namespace tessel::train
