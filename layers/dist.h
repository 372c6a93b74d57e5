// The dist util: data/tensor/pipeline sizes and the placements and SBPs
// layers use, LiBai-style.
//
//   dist::Setup({.data_parallel_size = 2, .tensor_parallel_size = 2});
//   Placement p = dist::GetLayerPlacement(0);      // the stage of layer 0
//   NdSbp x_sbp = dist::GetNdSbp({S(0), B()});     // [dp, tp] -> active mesh
//
// Rank layout: world = pp x dp x tp, and the parallel mode
// (layers/parallel_mode.h) says which ranks form each stage's [dp, tp]
// grid. The default, "1d", gives stage s the contiguous block of world/pp
// ranks with tp innermost.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/shape.h"
#include "layers/parallel_mode.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"

namespace tessel::dist {

struct Config {
  int64_t data_parallel_size = 0;  // 0: derived as world / (tp * pp)
  int64_t tensor_parallel_size = 1;
  int64_t pipeline_parallel_size = 1;
  int64_t pipeline_num_layers = 0;  // layers to spread over the stages (0: no layer index is valid but -1/0)
  // Model chunks per pipeline stage (Megatron's virtual pipeline, for the
  // interleaved_1f1b schedule): the layers are split into
  // pipeline_parallel_size x virtual_pipeline_size parts (virtual stages),
  // part j on stage j mod pipeline_parallel_size, so each stage holds v
  // parts spread along the model and the pipeline's bubble shrinks v-fold.
  int64_t virtual_pipeline_size = 1;
  // The stage of each layer (its virtual stage when virtual_pipeline_size >
  // 1), overriding the balanced split.
  std::vector<int64_t> custom_pipeline_stage_ids = {};
  DeviceType device_type = DeviceType::kCPU;  // where the layers' placements keep their shards
  // ZeRO (DeepSpeed's stages; LiBai's train.zero_optimization): over the
  // data-parallel ranks, 1 splits the optimizer state, 2 the gradients too,
  // 3 the parameters too (gathered where a layer computes with them). 0: off.
  int64_t zero_stage = 0;
  // Megatron's sequence parallelism: between the tensor-parallel regions
  // (layer norms, dropouts, residual adds) hidden states [batch, seq,
  // hidden] are split on the sequence over tp instead of replicated; the
  // all-reduces around each region become all-gathers and reduce-scatters.
  bool sequence_parallel = false;
  // DeepSpeed-Ulysses' sequence parallelism over the data-parallel ranks:
  // they share each micro-batch (micro_batch_size x dp rows) and split its
  // sequences instead of its rows; parameters stay replicated over dp and
  // their gradients all-reduced, as under data parallelism. Inside each
  // attention an all-to-all trades the sequence split for a split of the
  // heads (attention needs whole sequences) and a second one trades back.
  bool all_to_all_sequence_parallel = false;
  // Context parallelism over the data-parallel ranks (as Llama 3 trains
  // long sequences): they share each micro-batch and split its sequences,
  // as above, and each attention keeps its queries split and gathers every
  // key and value of the sequence (an all-gather over dp, a reduce-scatter
  // of their gradients); a causal mask follows each rank's offset in the
  // sequence. The score matrix [seq / dp, seq] and every other activation
  // are split over the ranks; the gathered keys and values are not.
  bool context_parallel = false;
  // The registered parallel mode that forms the stages' rank grids, and its
  // options (layers/parallel_mode.h).
  std::string tensor_parallel_mode = "1d";
  std::map<std::string, std::string> tensor_parallel_mode_options = {};
};

// Validates `config` against the world (comm::World() or a single process)
// and makes it current. Throws naming the sizes that disagree.
void Setup(const Config& config);
const Config& GetConfig();  // Setup's, with data_parallel_size filled in

int Rank();
int WorldSize();

// The stage of a layer (-1: the last layer), balanced or custom.
int64_t GetLayerStageId(int64_t layer_idx);
// Its virtual stage (the part of the model it belongs to, 0..pp x v - 1;
// its stage is this mod pp). Without virtual stages, the stage.
int64_t GetLayerVirtualStageId(int64_t layer_idx);
// The placement of a layer's stage: its ranks as [dp, tp], [dp], [tp] or [1]
// (mesh axes of size 1 are dropped).
Placement GetLayerPlacement(int64_t layer_idx);
// Named axes of the world's ranks: "dp", "tp" and "pp" (a rank's
// data-parallel, tensor-parallel and pipeline peers, each group in index
// order: dp and tp within the rank's stage grid, pp across the stages at
// the same grid position), "tp0", "tp1", ... (the axes of a multi-axis
// mode's tensor mesh, row-major inside each tp group) and those the
// parallel mode adds (ParallelMode::axes). Sorted.
std::vector<std::string> AxisNames();
// The ranks along `axis` in each group.
int64_t AxisSize(const std::string& axis);
// `rank`'s index along `axis` (-1: this rank); AxisRank("dp") is its
// data-parallel index in its stage's grid.
int64_t AxisRank(const std::string& axis, int rank = -1);
// The world ranks of `rank`'s group along `axis`, in the axis's order (-1:
// this rank's); an unknown axis throws, listing the names.
std::vector<int> AxisGroup(const std::string& axis, int rank = -1);
// For graph mode (GraphOptions): the world ranks of each pipeline stage,
// and the (virtual) stage of each of the pipeline_num_layers layers.
std::vector<std::vector<int>> StageRanks();
std::vector<int64_t> LayerStages();
// "4 layers on 2 stages: stage 0 (ranks 0..1): layers 0..1; stage 1 (ranks
// 2..3): layers 2..3".
std::string LayerAssignmentText();
// Every layer's stage ("pipeline: " + LayerAssignmentText(), pp > 1) and
// each stage's grid (modes other than 1d), a line each.
// Programs print it once their own checks pass (Setup says nothing, so a
// bad config or dataset found after it is the only thing said): a layer
// lost between the config and the stages shows here.
std::vector<std::string> LayoutLines();
// "stage 0 [dp x tp] = [[0 2] [4 6]]; stage 1 ...": each stage's grid, as
// the parallel mode formed it.
std::string StageGridText();
// The tensor-parallel mesh inside each tp group (the mode's tensor_mesh:
// {tp} for 1d, {q, q} for 2d, {depth, q, q} for 2.5d, {q, q, q} for 3d),
// and how layers lay their tensors on it.
std::vector<int64_t> TensorMesh();
TensorLayout GetTensorLayout();
// True under 2d, 2.5d and 3d: layers use LinearLayouts and friends below
// instead of 1d's column/row split.
bool MultiAxisTensorParallel();
// A [dp, tp] pair of Sbps reduced to the active mesh axes. Under a
// multi-axis mode the tp entry (B or P; a split is ambiguous there) is
// given to every tensor-parallel axis.
NdSbp GetNdSbp(const std::vector<Sbp>& dp_tp);
// `dp` with one Sbp per tensor-mesh axis, reduced to the active mesh axes.
NdSbp MeshSbp(const Sbp& dp, const std::vector<Sbp>& tensor_axes);

// Under a multi-axis mode, the layouts of a linear layer y = x W + b on
// the tensor mesh (x of `ndim` dimensions, features last): where x is kept
// between layers and where it is gathered to for the matmul, where W is
// kept and gathered to, the layout y is reduce-scattered to, and b's.
//   2d   x [S(0), S(L)] -> [S(0), B];  W [S(0), S(1)] -> [B, S(1)];
//        y [S(0), S(L)] (SUMMA: no reduction);  b [B, S(0)]
//   2.5d the same with the batch split over the depth first and W, b
//        replicated over it
//   3d   on the cube [A0, A1, A2], hidden states [b, s, h] keep h over A0,
//        s over A1, b over A2 (a second batch split would nest inside the
//        first, and gathering the outer one is no collective).
//        column: x [S(L), S(1), S(0)] -> [S(L), B, S(0)] (the sequence
//        gathered over A1); W [S(0), S(1), S(0)] -> [S(0), S(1), B]; x W,
//        partial over A0, reduce-scattered on the sequence to
//        y [S(1), S(L), S(0)]; b [B, S(0), B].
//        row: x [S(1), S(L), S(0)] -> [B, S(L), S(0)]; W [S(1), S(0), S(0)]
//        -> [S(1), S(0), B]; partial over A1, reduce-scattered on the
//        sequence to [S(L), S(1), S(0)], the column layer's input again.
//        Attention gathers keys and values over the sequence axis.
// `data` (a replicated weight): x's batch splits kept, features gathered.
struct LinearLayouts {
  NdSbp input, input_compute, weight, weight_compute, output, bias;
};
LinearLayouts MultiAxisLinearLayouts(bool column, bool data, int64_t ndim);
// The vocabulary embedding's table [V, H] (kept, and gathered for the
// lookup and the logits: the column layout's W transposed), and the ids'
// layout for the lookup.
struct EmbeddingLayouts {
  NdSbp table, table_compute, ids;
};
EmbeddingLayouts MultiAxisEmbeddingLayouts();
// Keys or values [batch, heads, seq, head_dim] (`nd_sbp`) with their
// sequence gathered (3d splits it; attention needs every key).
NdSbp AttentionKeySbp(const NdSbp& nd_sbp);
// In how many parts a column-parallel layer's output features are split
// (tp under 1d, q under 2d, 2.5d and 3d): attention heads and
// feature sizes must divide by it.
int64_t ColumnFeatureParts();
// A [features] parameter laid out like the last dimension of `activation`
// (split where it is split), replicated over dp.
NdSbp FeatureParameterSbp(const NdSbp& activation, int64_t ndim);
// Batch inputs (ids, labels, images): split on the batch over dp, B over tp.
// Under all-to-all sequence parallelism split on the sequence (dimension
// 1) over dp instead.
NdSbp GetHiddenSbp();
// The layout of a batch input of `ndim` dimensions as it enters a layer:
// the hidden layout; but when the dp ranks split sequences (they share every
// row), only tokens ([batch, seq] or [batch, seq, features]) are split on
// the sequence, and the rest — a value per row, an image — is replicated.
NdSbp BatchInputSbp(int64_t ndim);
// The dp-axis Sbp of batch inputs and hidden states: S(0), or S(1) under
// all-to-all sequence parallelism.
Sbp DataParallelSbp();
// The data-parallel ranks split sequences, not rows (all-to-all sequence
// parallelism or context parallelism).
bool SequencesSplitOverDataParallel();
// Hidden states [batch, seq, ...] between the tensor-parallel regions: the
// batch split over dp, and over tp the sequence split under sequence
// parallelism (B otherwise). Tensors of fewer than 3 dimensions (no
// sequence) take GetHiddenSbp.
NdSbp GetActivationSbp(int64_t ndim);

// ZeRO's layout of a tensor of `shape` laid out as `nd_sbp` (a parameter,
// replicated over dp): the data-parallel axis splits the first dimension
// that no other axis splits and that holds at least dp elements, so each
// dp rank keeps a part of its own shard (no data moves to get there).
// `nd_sbp` itself when dp is 1, its dp entry is not B, or no dimension fits.
NdSbp ZeroShardSbp(const Shape& shape, const NdSbp& nd_sbp);
// The layout layers create a parameter in: GetNdSbp({B(), tp}), split over
// dp as ZeroShardSbp says under ZeRO stage 3.
NdSbp GetParameterNdSbp(const Shape& shape, const Sbp& tp);
// The same for a layout given whole (replicated over dp).
NdSbp GetParameterNdSbp(const Shape& shape, const NdSbp& replicated);

}  // namespace tessel::dist
