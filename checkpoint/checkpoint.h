// Distributed checkpoints: every rank writes the boxes of the global
// tensors it holds to a safetensors shard of its own, and an index (JSON)
// records each tensor's logical shape, dtype, placement, NdSbp and which
// shard holds which box. A checkpoint saved under one layout loads under
// any other: each rank works out the box it needs of each tensor in its own
// layout and copies the overlapping parts of the saved boxes, read from the
// memory-mapped shards that hold them.
//
// On disk, in a checkpoint directory (train.checkpoint_dir):
//   iter_0000100/index.json                      the index and the trainer state
//   iter_0000100/shard-00000-of-00004.safetensors one per rank of the saving job
//   iter_0000100/config.prototxt                 the resolved config (when given)
//   latest                                       "iter_0000100": the last complete one
// A save writes into iter_N.tmp/, fsyncs every file, renames the directory
// and only then moves `latest`, so a job killed during a save leaves the
// previous checkpoint whole. Each saved box carries a CRC-32C (in its
// shard's metadata), checked when a load reads it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "sbp/slice.h"

namespace tessel::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, Tensor*>>;

// What the index says of one tensor.
struct SavedBox {
  int file = 0;  // index into CheckpointIndex::files
  Box box;
};
struct SavedTensor {
  std::string dtype;  // safetensors dtype name
  std::vector<int64_t> shape;
  std::string placement, nd_sbp;  // text forms; "" for a tensor that was not global
  std::vector<SavedBox> boxes;
};
struct CheckpointIndex {
  int world_size = 0;
  std::vector<std::string> files;
  std::map<std::string, SavedTensor> tensors;
  std::map<std::string, std::string> metadata;  // trainer state: iteration, arch, ...
};

// Parses index.json (`name` for errors); checks it fully (field types,
// shapes, boxes inside their tensor and covering it without overlap, file
// numbers in range). Throws naming the file and the tensor.
CheckpointIndex ParseIndex(std::string_view text, const std::string& name);
std::string IndexText(const CheckpointIndex& index);

struct SaveOptions {
  int64_t keep_last = 2;    // complete checkpoints kept (older ones removed); 0 keeps all
  std::string config_text;  // written as config.prototxt when not empty
};

// Collective over the world: every rank calls it with the same names in
// the same order. Saves `tensors` (global or local; partial sums refused)
// and `metadata` as checkpoint iter_<iteration> under `dir`; returns its
// directory. Throws naming the path or tensor.
std::filesystem::path Save(const std::filesystem::path& dir, int64_t iteration, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const SaveOptions& options = {});

// The checkpoint `path` names: a checkpoint directory (holding index.json)
// or a directory of them (its `latest`). Empty if `path` holds neither.
std::filesystem::path Find(const std::filesystem::path& path);

// Reads and checks a checkpoint's index.json.
CheckpointIndex ReadIndex(const std::filesystem::path& checkpoint);

struct LoadOptions {
  // Tensors whose rows past a count are padding (a vocabulary padded to a
  // multiple of 128 x tp): name -> the real row count. Their saved and
  // model row counts may differ (another tp pads otherwise); the real rows
  // are loaded and the model's padding rows are left as they are.
  std::map<std::string, int64_t> padded_rows;
};

// Loads a checkpoint (a directory holding index.json) into `tensors`, each
// in its own layout, in place. Every tensor must be in the checkpoint with
// the same shape (but for padding rows, see LoadOptions) and dtype. Returns the saved metadata. Throws naming
// the file and tensor for a missing tensor, a shape or dtype that disagrees, a truncated shard or a checksum
// that does not match; nothing is written to a tensor before its boxes are checked.
std::map<std::string, std::string> Load(const std::filesystem::path& checkpoint, const NamedTensors& tensors,
                                        const LoadOptions& options = {});

}  // namespace tessel::checkpoint
