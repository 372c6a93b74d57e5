#include "zoo/foreign_settings.h"

#include <algorithm>

namespace tessel::zoo {

namespace {
struct ForeignSetting {
  const char* name;  // dashes as Megatron-LM spells them
  const char* instead;
};
constexpr ForeignSetting kForeignSettings[] = {
    {"tensor-model-parallel-size", "--set train.dist.tensor_parallel_size=N"},
    {"pipeline-model-parallel-size", "--set train.dist.pipeline_parallel_size=N"},
    {"num-layers-per-virtual-pipeline-stage", "--set train.dist.virtual_pipeline_size=CHUNKS_PER_STAGE"},
    {"sequence-parallel", "--set train.dist.sequence_parallel=true"},
    {"use-distributed-optimizer", "--set train.zero_optimization.enabled=true"},
    {"micro-batch-size", "--set train.micro_batch_size=N"},
    {"global-batch-size", "--set train.global_batch_size=N"},
    {"train-iters", "--set train.train_iter=N"},
    {"lr", "--set optim.lr=X"},
    {"min-lr", "--set scheduler.min_lr=X"},
    {"lr-warmup-iters", "--set scheduler.warmup_iter=N"},
    {"lr-decay-style", "--set scheduler.name=warmup_cosine (or warmup_linear, constant)"},
    {"weight-decay", "--set optim.weight_decay=X"},
    {"clip-grad", "--set optim.clip_grad_norm=X"},
    {"adam-beta1", "--set optim.beta1=X"},
    {"adam-beta2", "--set optim.beta2=X"},
    {"adam-eps", "--set optim.eps=X"},
    {"num-layers", "--set model.hidden_layers=N"},
    {"hidden-size", "--set model.hidden_size=N"},
    {"ffn-hidden-size", "--set model.ffn_hidden_size=N"},
    {"num-attention-heads", "--set model.num_attention_heads=N"},
    {"seq-length", "--set model.max_seq_length=N"},
    {"max-position-embeddings", "--set model.max_position_embeddings=N"},
    {"data-path", "--set data.data_prefix=PREFIX (several, mixed by weight: data.blend in the config)"},
    {"split", "--set data.split=949,50,1"},
    {"save", "--set train.checkpoint_dir=DIR"},
    {"load", "--set train.checkpoint_dir=DIR (train.resume auto continues from it)"},
    {"save-interval", "--set train.save_period=N"},
    {"log-interval", "--set train.log_period=N"},
    {"eval-interval", "--set evaluation.eval_period=N"},
    {"eval-iters", "--set evaluation.eval_iter=N"},
    {"seed", "--set train.seed=N"},
    {"bf16", "--set train.amp.enabled=true --set train.amp.dtype=bf16"},
    {"fp16", "--set train.amp.enabled=true --set train.amp.dtype=f16"},
    {"recompute-activations", "--set train.activation_checkpoint=true"},
    {"recompute-granularity", "--set train.activation_checkpoint=true"},
    {"nproc-per-node", "tessel-launch --nproc_per_node N -- tessel-train ... (a launcher flag)"},
    {"nnodes", "tessel-launch --nnodes N -- tessel-train ... (a launcher flag)"},
    {"node-rank", "tessel-launch --node_rank R -- tessel-train ... (a launcher flag)"},
    {"master-addr", "tessel-launch --master_addr HOST -- tessel-train ... (a launcher flag)"},
    {"master-port", "tessel-launch --master_port PORT -- tessel-train ... (a launcher flag)"},
};

}  // namespace

std::string ForeignSettingInstead(const std::string& name) {
  std::string dashed = name;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  for (const ForeignSetting& f : kForeignSettings)
    if (dashed == f.name) return f.instead;
  return "";
}

}  // namespace tessel::zoo
