// Parallel modes: how the world's ranks form the mesh the layers' global
// tensors live on. A mode takes the sizes of the config (data, tensor and
// pipeline parallel, and the mode's own options) and gives the ranks of
// each pipeline stage as a [dp, tp] grid; dist::Setup (layers/dist.h)
// validates the grid and every placement, process group and batch split
// follows from it. The communication a layer needs comes from the layouts
// on that grid, so a mode changes which ranks talk, never the result.
//
// Built in, each holding stage s on the contiguous block of world / pp ranks
// with tp innermost (a tensor-parallel group is ranks next to each other,
// one machine's GPUs; data-parallel peers are tp apart):
//   "1d"   Megatron's: one tensor-parallel axis; column- and row-parallel
//          linears, hidden states replicated over tp.
//   "2d"   SUMMA (Optimus) on a q x q tensor-parallel mesh, tp = q^2: hidden
//          states split on the batch over the rows and on the features over
//          the columns, weights split on both dimensions.
//   "2.5d" Tesseract on d x q x q, tp = d q^2 (option depth = d): 2d's
//          layouts with the batch split over the depth too, weights
//          replicated over it.
//   "3d"   on a q x q x q cube, tp = q^3: activations and weights split over
//          all three axes.
// The tensor mesh of the last three is laid out row-major inside each tp
// group (the last axis innermost). The config picks a mode by train.dist.tensor_parallel_mode; a
// program adds its own before dist::Setup (docs/extending.md):
//
//   dist::RegisterParallelMode("dp_inner", {.stage_ranks = [](const dist::ParallelModeSizes& s) {
//     ...  // stage -> ranks in [dp, tp] order
//   }});
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tessel::dist {

struct ParallelModeSizes {
  int64_t world_size = 1;
  int64_t data_parallel_size = 1, tensor_parallel_size = 1, pipeline_parallel_size = 1;
  std::map<std::string, std::string> options;  // train.dist.tensor_parallel_mode_options
};

// How layers lay their tensors on the tensor-parallel mesh
// (layers/dist.h's LinearLayouts and friends).
enum class TensorLayout { k1d, k2d, k2p5d, k3d };

// A named axis of the world's ranks beside the built-in ones (an expert,
// context or machine axis, say): the ranks split into groups of one size,
// each group listed in the axis's order, so a rank's index in its group is
// its index along the axis (dist::AxisRank). Every rank is in one group.
struct NamedAxis {
  std::string name;
  std::vector<std::vector<int>> groups;
};

struct ParallelMode {
  // Throws, naming the size or option and what the mode needs, when the
  // sizes do not form its mesh. May be empty (any sizes do).
  std::function<void(const ParallelModeSizes&)> check;
  // For each of the pipeline_parallel_size stages, its
  // data_parallel_size x tensor_parallel_size ranks, row-major: entry
  // d * tp + t is the rank at data-parallel index d, tensor-parallel
  // index t. Together the stages hold every rank of the world once.
  std::function<std::vector<std::vector<int>>(const ParallelModeSizes&)> stage_ranks;
  // The layers' layouts, and the shape of the tensor-parallel mesh inside
  // each tp group (a product equal to tensor_parallel_size; the tp index
  // is row-major over it). Empty: the one axis {tensor_parallel_size}.
  TensorLayout layout = TensorLayout::k1d;
  std::function<std::vector<int64_t>(const ParallelModeSizes&)> tensor_mesh;
  // Axes the mode adds beside dp, tp, pp (and a multi-axis tensor mesh's
  // tp0, tp1, ...), queried by name with dist::AxisRank, AxisSize and
  // AxisGroup; dist::Setup checks each is a partition of the world into
  // groups of one size. May be empty.
  std::function<std::vector<NamedAxis>(const ParallelModeSizes&)> axes;
};

// Adds a mode under `name` (letters, digits, '_', '-', '.'). Throws if the
// name is taken or malformed, or stage_ranks is empty. Thread-safe.
void RegisterParallelMode(const std::string& name, ParallelMode mode);
// The registered names, sorted.
std::vector<std::string> ParallelModeNames();
// The mode `name`; an unregistered name throws listing the registered ones.
ParallelMode FindParallelMode(const std::string& name);

}  // namespace tessel::dist
