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
// previous checkpoint whole.
//
// A saved box is stored as a grid of chunks (ChunkGrid: at most 256 KiB
// each, cut along its longest extents), each a tensor of its own in the
// shard with its own CRC-32C in the shard's metadata. A rank loading under
// another layout reads (pread, read-ahead off) and checks only the chunks
// its boxes overlap: a split along rows or columns of a saved box reads
// little more than what the rank keeps.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "sbp/slice.h"
#include "zoo/config.pb.h"

namespace tessel::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, Tensor*>>;

// What the index says of one tensor.
struct SavedBox {
  int file = 0;  // index into CheckpointIndex::files
  Box box;
  // Parts per dimension the box is stored as (balanced splits; empty: one
  // chunk, the whole box, as version-1 checkpoints store every box).
  std::vector<int64_t> chunks;
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
  // Drawn for each save and written into every shard too (kSaveIdKey), so a
  // shard from another run or iteration (same names and shapes) is refused
  // rather than loaded. Empty in checkpoints saved before it existed.
  std::string save_id;
};

// The metadata key of a shard's save id.
inline constexpr const char* kSaveIdKey = "tessel.save_id";

// Parses index.json (`name` for errors); checks it fully (field types,
// shapes, boxes inside their tensor and covering it without overlap, file
// numbers in range). Throws naming the file and the tensor.
CheckpointIndex ParseIndex(std::string_view text, const std::string& name);
std::string IndexText(const CheckpointIndex& index);

// The chunk grid a save stores a box of `shape` as: starting from one
// chunk, the dimension whose chunks are longest is cut in more parts (1,
// 2, 6, 12, 24, ...) until a chunk holds at most `chunk_bytes` (or no
// dimension can be cut further). Where the extent divides by the grid's
// count, chunk edges fall on the balanced split points of every count that
// divides it (6: 2, 3 and 6 parts of the box; 12: 4 and 12 too; 24: 8 too),
// so a load under another tensor- or data-parallel size mostly reads whole
// chunks it keeps (otherwise an edge is off by one element, and a chunk row
// or column more is read). `split_dims`, the dimensions the saving layout
// splits (the ones another tensor-parallel size splits too), start at 6
// parts when each part still holds a quarter of `chunk_bytes`.
std::vector<int64_t> ChunkGrid(const Shape& shape, size_t element_size, int64_t chunk_bytes,
                               const std::vector<int64_t>& split_dims = {});
// The chunks of `saved` (all of it when it has no grid), each as the box it
// covers of the tensor and its name in the shard: the tensor's name for a
// one-chunk box, else "<tensor>#<k>" with k the chunk's row-major index.
struct Chunk {
  Box box;
  std::string entry;
};
std::vector<Chunk> Chunks(const std::string& tensor, const SavedBox& saved);
// The chunks of `saved` that overlap `box`, found by arithmetic: a reader
// never lists a grid's chunks it does not read (an index may claim a grid
// of millions).
// Throws naming the tensor if more than `max_chunks` overlap (counted
// before any is listed).
std::vector<Chunk> ChunksOverlapping(const std::string& tensor, const SavedBox& saved, const Box& box,
                                     int64_t max_chunks = int64_t{1} << 24);

struct SaveOptions {
  int64_t keep_last = 2;    // complete checkpoints kept (older ones removed); 0 keeps all
  std::string config_text;  // written as config.prototxt when not empty
  // ChunkGrid's bound; raised for a save whose largest shard would hold
  // more than 200,000 chunks (their header would pass safetensors' 100 MB).
  int64_t chunk_bytes = int64_t{256} << 10;
};

// Collective over the world: every rank calls it with the same names in
// the same order. Saves `tensors` (global or local; partial sums refused)
// and `metadata` as checkpoint iter_<iteration> under `dir`; returns its
// directory. Throws naming the path or tensor.
std::filesystem::path Save(const std::filesystem::path& dir, int64_t iteration, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const SaveOptions& options = {});

// A job's claim on a checkpoint directory, held while it lives: made (with
// the directory) before the first step, so a path that cannot be a
// directory, or one another job is writing, is named at once instead of at
// the first save. An advisory lock (flock) on <dir>/.lock, which holds the
// owner's pid and host.
class DirectoryLock {
 public:
  // Throws naming the directory (and the holder, if locked).
  explicit DirectoryLock(const std::filesystem::path& dir);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// The name of the checkpoint of `iteration` in its directory: iter_0000042.
std::string IterationName(int64_t iteration);

// The checkpoint `path` names: a checkpoint directory (holding index.json)
// or a directory of them (its `latest`). Empty if `path` holds neither.
std::filesystem::path Find(const std::filesystem::path& path);

// Reads and checks a checkpoint's index.json.
CheckpointIndex ReadIndex(const std::filesystem::path& checkpoint);

// The config a checkpoint was saved with (its config.prototxt, at most
// zoo::kMaxConfigBytes), or nullopt if it has none. Throws naming the file
// if it is unreadable or malformed.
std::optional<config::Config> SavedConfig(const std::filesystem::path& checkpoint);

// What a load read: the bytes of the tensors' boxes this rank keeps
// (needed), the bytes of the chunks it read for them (read: needed plus the
// parts of chunks that stick out of its boxes), and how many chunks.
struct LoadStats {
  int64_t bytes_needed = 0;
  int64_t bytes_read = 0;
  int64_t chunks_read = 0;
};

struct LoadOptions {
  // Tensors whose rows past a count are padding (a vocabulary padded to a
  // multiple of 128 x tp): name -> the real row count. Their saved and
  // model row counts may differ (another tp pads otherwise); the real rows
  // are loaded and the model's padding rows are left as they are.
  std::map<std::string, int64_t> padded_rows;
  LoadStats* stats = nullptr;  // filled when given
};

// Reads boxes of a checkpoint's tensors: opens the shards a read needs (the
// header memory-mapped without read-ahead, the data with pread), reads and
// checks the chunks a box overlaps and nothing else.
class Reader {
 public:
  // Reads and checks index.json of `checkpoint` (a directory holding it).
  explicit Reader(const std::filesystem::path& checkpoint);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  const CheckpointIndex& index() const { return index_; }
  const std::filesystem::path& path() const { return path_; }
  // The box `box` of tensor `name` (in its logical coordinates), row-major
  // into `out` of box.shape() elements of the saved dtype. Every chunk is
  // checked (entry, dtype, shape, CRC-32C) before any byte goes to `out`.
  // Throws naming the shard and tensor for a damaged or missing chunk.
  void ReadBox(const std::string& name, const Box& box, void* out);
  // The whole tensor `name` as a host tensor.
  Tensor ReadTensor(const std::string& name);
  const LoadStats& stats() const { return stats_; }

 private:
  struct Shard;
  struct Piece;
  Shard& OpenShard(int file);
  // The chunks `box` of `name` overlaps, each checked against its shard's
  // header (so what a read allocates is backed by bytes on disk).
  std::vector<Piece> Plan(const std::string& name, const Box& box, size_t* element);
  void ReadPieces(std::vector<Piece>& pieces, const std::string& name, const Box& box, size_t element,
                  void* out);

  std::filesystem::path path_;
  CheckpointIndex index_;
  std::map<int, std::unique_ptr<Shard>> shards_;
  LoadStats stats_;
  // Read buffer, kept between reads (fresh memory for every tensor costs a
  // page fault per 4 KiB): as large as the largest read so far.
  std::unique_ptr<uint8_t[]> scratch_;
  uint64_t scratch_bytes_ = 0;
};

// Loads a checkpoint (a directory holding index.json) into `tensors`, each
// in its own layout, in place. Every tensor must be in the checkpoint with
// the same shape (but for padding rows, see LoadOptions) and dtype. Returns the saved metadata. Throws naming
// the file and tensor for a missing tensor, a shape or dtype that disagrees, a truncated shard or a checksum
// that does not match; nothing is written to a tensor before its boxes are checked.
std::map<std::string, std::string> Load(const std::filesystem::path& checkpoint, const NamedTensors& tensors,
                                        const LoadOptions& options = {});

}  // namespace tessel::checkpoint
