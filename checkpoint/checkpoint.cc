#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "core/box_copy.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "sbp/global_tensor.h"
#include "sbp/placement.h"
#include "zoo/config.h"
#include "zoo/crc32c.h"
#include "zoo/safetensors.h"

namespace tessel::checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "tessel.checkpoint";
// Version 2 stores boxes as chunk grids ("chunks" per box); version 1
// (one tensor per box) still loads.
constexpr int kVersion = 2;
constexpr int kOldestVersion = 1;
constexpr int64_t kMaxChunksPerBox = int64_t{1} << 24;
constexpr int64_t kMaxChunksPerShard = 200'000;
constexpr uint64_t kMaxIndexBytes = 1ull << 30;
constexpr int64_t kMaxDim = int64_t{1} << 48;
constexpr size_t kMaxBoxes = 1 << 16;  // per tensor: one per distinct shard of the saving job at most

std::string ShardName(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof(name), "shard-%05d-of-%05d.safetensors", rank, world);
  return name;
}

// FNV-1a over `text`, continuing from `hash`.
constexpr uint64_t kFnvBasis = 14695981039346656037ull;
uint64_t Fnv1a(uint64_t hash, const std::string& text) {
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return (hash ^ 0xff) * 1099511628211ull;  // a separator, so "ab"+"c" differs from "a"+"bc"
}

// The metadata key of a shard entry's checksum.
std::string CrcKey(const std::string& entry) { return "crc32c:" + entry; }

// Writes `text` to `path` and fsyncs it.
void WriteDurably(const fs::path& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    TESSEL_CHECK(out.good()) << "checkpoint: cannot write " << path.string() << ": " << std::strerror(errno);
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  TESSEL_CHECK(fd >= 0 && ::fsync(fd) == 0)
      << "checkpoint: cannot fsync " << path.string() << ": " << std::strerror(errno);
  ::close(fd);
}

void Fsync(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  TESSEL_CHECK(fd >= 0) << "checkpoint: cannot open " << path.string() << ": " << std::strerror(errno);
  const int rc = ::fsync(fd);
  ::close(fd);
  TESSEL_CHECK(rc == 0) << "checkpoint: cannot fsync " << path.string() << ": " << std::strerror(errno);
}

std::vector<int64_t> Dims(const Shape& s) { return s.dims(); }

// The box `rank` holds of tensor `t` (the whole tensor if it is local).
Box HeldBox(const Tensor& t, int rank) {
  if (!t.is_global()) return Box::Full(t.shape());
  return LocalBox(t.shape(), t.placement(), t.nd_sbp(), rank);
}

// The ranks that write `t`: for each distinct box, the first rank of the
// placement holding it (rank 0 for a local tensor, which every rank holds whole).
std::vector<std::pair<int, Box>> Writers(const Tensor& t) {
  if (!t.is_global()) return {{0, Box::Full(t.shape())}};
  std::vector<std::pair<int, Box>> writers;
  std::set<Box> seen;
  for (int r : t.placement().ranks()) {
    Box b = LocalBox(t.shape(), t.placement(), t.nd_sbp(), r);
    if (seen.insert(b).second) writers.emplace_back(r, std::move(b));
  }
  return writers;
}

// Fault injection for the tests of the commit protocol: with
// TESSEL_CHECKPOINT_KILL=<point> ("shards", "index" or "rename"), rank 0
// kills itself (SIGKILL, as an out-of-memory killer or a lost node would)
// at that point of every save.
void MaybeKill(const char* point, int rank) {
  const char* wanted = std::getenv("TESSEL_CHECKPOINT_KILL");
  if (rank == 0 && wanted != nullptr && std::strcmp(wanted, point) == 0) std::raise(SIGKILL);
}

int64_t IterationOf(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("iter_", 0) != 0 || name.size() != 12) return -1;
  int64_t value = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return -1;
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace

std::string IterationName(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07ld", static_cast<long>(iteration));
  return name;
}

CheckpointIndex ParseIndex(std::string_view text, const std::string& name) {
  TESSEL_CHECK(text.size() <= kMaxIndexBytes)
      << "checkpoint index " << name << ": " << text.size() << " bytes; expected at most " << kMaxIndexBytes;
  const nlohmann::json j =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  TESSEL_CHECK(j.is_object()) << "checkpoint index " << name << " is not a JSON object";
  TESSEL_CHECK(j.contains("format") && j["format"] == kFormat)
      << "checkpoint index " << name << " is not a tessel checkpoint index (its \"format\" is not \""
      << kFormat << "\")";
  TESSEL_CHECK(j.contains("version") && j["version"].is_number_unsigned() &&
               j["version"].get<uint64_t>() >= kOldestVersion && j["version"].get<uint64_t>() <= kVersion)
      << "checkpoint index " << name << ": version "
      << (j.contains("version") ? j["version"].dump() : "missing") << "; expected " << kOldestVersion
      << " to " << kVersion << " (a newer tessel wrote it?)";
  CheckpointIndex index;
  const nlohmann::json& world = j.contains("world_size") ? j["world_size"] : nlohmann::json();
  TESSEL_CHECK(world.is_number_unsigned() && world.get<uint64_t>() >= 1 &&
               world.get<uint64_t>() <= (1u << 24))
      << "checkpoint index " << name << ": world_size " << world.dump() << "; expected a positive integer";
  index.world_size = static_cast<int>(world.get<uint64_t>());
  const nlohmann::json& files = j.contains("files") ? j["files"] : nlohmann::json();
  TESSEL_CHECK(files.is_array()) << "checkpoint index " << name << ": \"files\" is not an array";
  for (const nlohmann::json& f : files) {
    TESSEL_CHECK(f.is_string() && !f.get<std::string>().empty() &&
                 f.get<std::string>().find('/') == std::string::npos && f.get<std::string>() != "..")
        << "checkpoint index " << name << ": file " << f.dump() << " is not a file name in the checkpoint";
    index.files.push_back(f.get<std::string>());
  }
  if (j.contains("save_id")) {
    const nlohmann::json& id = j["save_id"];
    TESSEL_CHECK(id.is_string() && !id.get<std::string>().empty() && id.get<std::string>().size() <= 32 &&
                 id.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos)
        << "checkpoint index " << name << ": save_id " << id.dump().substr(0, 80)
        << "; expected up to 32 lower-case hex digits";
    index.save_id = id.get<std::string>();
  }
  if (j.contains("metadata")) {
    TESSEL_CHECK(j["metadata"].is_object())
        << "checkpoint index " << name << ": \"metadata\" is not an object";
    for (const auto& [k, v] : j["metadata"].items()) {
      TESSEL_CHECK(v.is_string()) << "checkpoint index " << name << ": metadata '" << k
                                  << "' is not a string";
      index.metadata[k] = v.get<std::string>();
    }
  }
  const nlohmann::json& tensors = j.contains("tensors") ? j["tensors"] : nlohmann::json();
  TESSEL_CHECK(tensors.is_object()) << "checkpoint index " << name << ": \"tensors\" is not an object";
  for (const auto& [key, value] : tensors.items()) {
    const std::string tensor_name = key;
    auto where = [&] { return "checkpoint index " + name + ": tensor '" + tensor_name + "'"; };
    TESSEL_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                 value.contains("boxes") && value["dtype"].is_string() && value["shape"].is_array() &&
                 value["boxes"].is_array())
        << where() << " needs dtype (a string), shape and boxes (arrays)";
    SavedTensor t;
    t.dtype = value["dtype"].get<std::string>();
    (void)zoo::SafetensorsElementSize(t.dtype);  // throws naming an unknown dtype
    for (const nlohmann::json& d : value["shape"]) {
      TESSEL_CHECK(d.is_number_unsigned() && d.get<uint64_t>() < static_cast<uint64_t>(kMaxDim))
          << where() << ": shape " << value["shape"].dump() << "; expected non-negative integers";
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    TESSEL_CHECK(t.shape.size() <= 16)
        << where() << ": " << t.shape.size() << " dimensions; expected at most 16";
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      TESSEL_CHECK(d == 0 || elements <= (uint64_t{1} << 62) / static_cast<uint64_t>(d))
          << where() << ": shape " << value["shape"].dump() << " holds more than 2^62 elements";
      elements *= static_cast<uint64_t>(d);
    }
    TESSEL_CHECK(value["boxes"].size() <= kMaxBoxes)
        << where() << ": " << value["boxes"].size() << " boxes; expected at most " << kMaxBoxes;
    for (const char* field : {"placement", "nd_sbp"}) {
      if (!value.contains(field)) continue;
      TESSEL_CHECK(value[field].is_string()) << where() << ": " << field << " is not a string";
      (field == std::string("placement") ? t.placement : t.nd_sbp) = value[field].get<std::string>();
    }
    const Box full = Box::Full(Shape(t.shape));
    int64_t covered = 0;
    for (const nlohmann::json& b : value["boxes"]) {
      TESSEL_CHECK(b.is_object() && b.contains("file") && b.contains("begin") && b.contains("end") &&
                   b["file"].is_number_unsigned() && b["file"].get<uint64_t>() < index.files.size() &&
                   b["begin"].is_array() && b["end"].is_array() && b["begin"].size() == t.shape.size() &&
                   b["end"].size() == t.shape.size())
          << where() << ": box " << b.dump().substr(0, 200) << "; expected {file: a number below "
          << index.files.size() << ", begin and end: " << t.shape.size() << " coordinates each}";
      std::vector<Range> ranges;
      for (size_t d = 0; d < t.shape.size(); ++d) {
        const nlohmann::json &lo = b["begin"][d], &hi = b["end"][d];
        TESSEL_CHECK(lo.is_number_unsigned() && hi.is_number_unsigned() &&
                     lo.get<uint64_t>() <= hi.get<uint64_t>() &&
                     hi.get<uint64_t>() <= static_cast<uint64_t>(t.shape[d]))
            << where() << ": box " << b.dump().substr(0, 200) << " is not inside its shape "
            << value["shape"].dump();
        ranges.push_back(
            {static_cast<int64_t>(lo.get<uint64_t>()), static_cast<int64_t>(hi.get<uint64_t>())});
      }
      SavedBox saved{static_cast<int>(b["file"].get<uint64_t>()), Box(std::move(ranges)), {}};
      if (b.contains("chunks")) {
        const nlohmann::json& grid = b["chunks"];
        TESSEL_CHECK(grid.is_array() && grid.size() == t.shape.size())
            << where() << ": box " << b.dump().substr(0, 200) << ": \"chunks\" is not an array of "
            << t.shape.size() << " part counts";
        int64_t count = 1;
        for (size_t d = 0; d < grid.size(); ++d) {
          const int64_t extent = saved.box[static_cast<int64_t>(d)].size();
          TESSEL_CHECK(grid[d].is_number_unsigned() && grid[d].get<uint64_t>() >= 1 &&
                       grid[d].get<uint64_t>() <= static_cast<uint64_t>(std::max<int64_t>(1, extent)))
              << where() << ": box " << b.dump().substr(0, 200) << ": chunks " << grid.dump()
              << "; expected between 1 and the box's extent per dimension";
          saved.chunks.push_back(static_cast<int64_t>(grid[d].get<uint64_t>()));
          // Checked before multiplying: the product must not overflow.
          TESSEL_CHECK(saved.chunks.back() <= kMaxChunksPerBox / count)
              << where() << ": box " << b.dump().substr(0, 200) << " has more than " << kMaxChunksPerBox
              << " chunks";
          count *= saved.chunks.back();
        }
      }
      for (const SavedBox& other : t.boxes)
        TESSEL_CHECK(saved.box.Intersect(other.box).empty())
            << where() << ": boxes " << saved.box.ToString() << " and " << other.box.ToString() << " overlap";
      covered += saved.box.numel();
      t.boxes.push_back(std::move(saved));
    }
    TESSEL_CHECK(covered == full.numel())
        << where() << ": its boxes cover " << covered << " of " << full.numel() << " elements";
    index.tensors.emplace(tensor_name, std::move(t));
  }
  return index;
}

std::string IndexText(const CheckpointIndex& index) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["world_size"] = index.world_size;
  j["files"] = index.files;
  if (!index.save_id.empty()) j["save_id"] = index.save_id;
  j["metadata"] = nlohmann::json::object();
  for (const auto& [k, v] : index.metadata) j["metadata"][k] = v;
  j["tensors"] = nlohmann::json::object();
  for (const auto& [name, t] : index.tensors) {
    nlohmann::json e;
    e["dtype"] = t.dtype;
    e["shape"] = t.shape;
    if (!t.placement.empty()) e["placement"] = t.placement;
    if (!t.nd_sbp.empty()) e["nd_sbp"] = t.nd_sbp;
    e["boxes"] = nlohmann::json::array();
    for (const SavedBox& b : t.boxes) {
      std::vector<int64_t> begin, end;
      for (int64_t d = 0; d < b.box.ndim(); ++d) {
        begin.push_back(b.box[d].begin);
        end.push_back(b.box[d].end);
      }
      nlohmann::json box = {{"file", b.file}, {"begin", begin}, {"end", end}};
      if (std::any_of(b.chunks.begin(), b.chunks.end(), [](int64_t p) { return p > 1; }))
        box["chunks"] = b.chunks;
      e["boxes"].push_back(std::move(box));
    }
    j["tensors"][name] = std::move(e);
  }
  return j.dump(1);
}

std::vector<int64_t> ChunkGrid(const Shape& shape, size_t element_size, int64_t chunk_bytes,
                               const std::vector<int64_t>& split_dims) {
  const int64_t n = shape.ndim();
  std::vector<int64_t> parts(n, 1);
  // Only where each of the 6 parts still holds a quarter chunk or more.
  if (shape.numel() * static_cast<int64_t>(element_size) >= 6 * (chunk_bytes / 4))
    for (int64_t d : split_dims)
      if (d >= 0 && d < n) parts[d] = std::min<int64_t>(6, std::max<int64_t>(1, shape[d]));
  auto extent = [&](int64_t d) { return (shape[d] + parts[d] - 1) / parts[d]; };  // the largest chunk's
  while (true) {
    int64_t bytes = static_cast<int64_t>(element_size), longest = -1;
    for (int64_t d = 0; d < n; ++d) {
      bytes *= extent(d);
      if (extent(d) >= 2 && (longest < 0 || extent(d) > extent(longest))) longest = d;
    }
    if (bytes <= chunk_bytes || longest < 0) return parts;
    // 1, 2, 6, 12, 24, ...: chunk edges fall on the split points of 2, 3
    // and 6 parts of the box, from 12 on of 4 and 12, from 24 on of 8.
    const int64_t next = parts[longest] == 2 ? 6 : parts[longest] * 2;
    parts[longest] = std::min(next, shape[longest]);
  }
}

namespace {
// The part of `parts` balanced parts of `range` holding position x.
int64_t PartOf(const Range& range, int64_t parts, int64_t x) {
  const int64_t n = range.size(), q = n / parts, r = n % parts, at = x - range.begin;
  return at < (q + 1) * r ? at / (q + 1) : r + (at - (q + 1) * r) / q;
}
}  // namespace

std::vector<Chunk> ChunksOverlapping(const std::string& tensor, const SavedBox& saved, const Box& box,
                                     int64_t max_chunks) {
  const Box overlap = saved.box.Intersect(box);
  if (overlap.empty()) return {};
  const int64_t n = saved.box.ndim();
  const std::vector<int64_t> grid = saved.chunks.empty() ? std::vector<int64_t>(n, 1) : saved.chunks;
  if (std::all_of(grid.begin(), grid.end(), [](int64_t p) { return p == 1; })) return {{saved.box, tensor}};
  // Per dimension, the parts the overlap touches; their count before any is listed.
  std::vector<int64_t> first(n), last(n);
  int64_t touched = 1;
  for (int64_t d = 0; d < n; ++d) {
    first[d] = PartOf(saved.box[d], grid[d], overlap[d].begin);
    last[d] = PartOf(saved.box[d], grid[d], overlap[d].end - 1);
    const int64_t parts = last[d] - first[d] + 1;
    TESSEL_CHECK(parts <= max_chunks / touched)
        << "checkpoint: tensor '" << tensor << "': its box " << saved.box.ToString() << " in " << Shape(grid)
        << " chunks has more chunks over " << box.ToString() << " than the " << max_chunks
        << " its shard can hold (a damaged index?)";
    touched *= parts;
  }
  std::vector<Chunk> chunks;
  std::vector<int64_t> coord = first;
  while (true) {
    std::vector<Range> ranges(n);
    int64_t index = 0;
    for (int64_t d = 0; d < n; ++d) {
      ranges[d] = BalancedPart(saved.box[d], grid[d], coord[d]);
      index = index * grid[d] + coord[d];
    }
    chunks.push_back({Box(std::move(ranges)), tensor + "#" + std::to_string(index)});
    int64_t d = n - 1;
    while (d >= 0 && coord[d] == last[d]) {
      coord[d] = first[d];
      --d;
    }
    if (d < 0) break;
    ++coord[d];
  }
  return chunks;
}

std::vector<Chunk> Chunks(const std::string& tensor, const SavedBox& saved) {
  const bool one = std::all_of(saved.chunks.begin(), saved.chunks.end(), [](int64_t p) { return p == 1; });
  if (one) return {{saved.box, tensor}};  // an empty box too: one (empty) entry
  return ChunksOverlapping(tensor, saved, saved.box);
}

fs::path Save(const fs::path& dir, int64_t iteration, const NamedTensors& tensors,
              const std::map<std::string, std::string>& metadata, const SaveOptions& options) {
  const int rank = CurrentRank(), world = CurrentWorldSize();
  comm::Communicator& comm = comm::World();
  const fs::path final_dir = dir / IterationName(iteration);
  const fs::path tmp = dir / (IterationName(iteration) + ".tmp");
  // Checked on every rank before anything is written.
  CheckpointIndex index;
  index.world_size = world;
  index.metadata = metadata;
  for (int r = 0; r < world; ++r) index.files.push_back(ShardName(r, world));
  // This rank's chunks, written straight from its shards (no copies): the
  // checksums first (they go in the header), then the bytes.
  std::vector<zoo::SafetensorsSource> mine;
  std::map<std::string, std::string> crcs;
  TESSEL_CHECK(options.chunk_bytes > 0)
      << "checkpoint: chunk_bytes " << options.chunk_bytes << "; expected a positive byte count";
  // Chunks large enough that no shard holds more than kMaxChunksPerShard
  // (each costs about 160 header bytes; a reader refuses headers over 100
  // MB). Every rank works it out alike from the layouts.
  int64_t chunk_bytes = options.chunk_bytes;
  {
    std::map<int, int64_t> shard_bytes;
    for (const auto& [name, t] : tensors)
      if (t != nullptr && t->defined())
        for (const auto& [writer, box] : Writers(*t))
          shard_bytes[writer] += box.numel() * static_cast<int64_t>(ElementSize(t->dtype()));
    for (const auto& [writer, bytes] : shard_bytes)
      chunk_bytes = std::max(chunk_bytes, (bytes + kMaxChunksPerShard - 1) / kMaxChunksPerShard);
  }
  for (const auto& [name, t] : tensors) {
    TESSEL_CHECK(t != nullptr && t->defined()) << "checkpoint: tensor '" << name << "' is undefined";
    TESSEL_CHECK(!t->is_global() || !t->nd_sbp().has_partial())
        << "checkpoint: tensor '" << name << "' is laid out as " << t->nd_sbp().ToString()
        << " (partial values); expected split or broadcast";
    SavedTensor& saved = index.tensors[name];
    TESSEL_CHECK(saved.boxes.empty()) << "checkpoint: tensor name '" << name << "' given twice";
    saved.dtype = zoo::SafetensorsDType(t->dtype());
    saved.shape = Dims(t->shape());
    if (t->is_global()) {
      saved.placement = t->placement().ToString();
      saved.nd_sbp = t->nd_sbp().ToString();
    }
    const size_t element = ElementSize(t->dtype());
    std::vector<int64_t> split_dims;
    if (t->is_global())
      for (const Sbp& sbp : t->nd_sbp().sbps())
        if (sbp.is_split()) split_dims.push_back(sbp.axis());
    for (auto& [writer, box] : Writers(*t)) {
      saved.boxes.push_back({writer, box, ChunkGrid(box.shape(), element, chunk_bytes, split_dims)});
      if (writer != rank) continue;
      const Tensor local = t->to_local().To(Device::CPU());  // a GPU shard is written from a host copy
      const std::vector<int64_t> held = Dims(box.shape());
      for (const Chunk& chunk : Chunks(name, saved.boxes.back())) {
        const std::vector<int64_t> offset = chunk.box.OffsetIn(box), extent = Dims(chunk.box.shape());
        zoo::Crc32cAccumulator crc;
        const auto* base = static_cast<const uint8_t*>(local.raw_data());
        ForEachRun(held, offset, extent, element,
                   [&](int64_t at, size_t bytes) { crc.Update(base + at, bytes); });
        crcs[CrcKey(chunk.entry)] = std::to_string(crc.value());
        mine.push_back({chunk.entry, saved.dtype, extent,
                        [local, held, offset, extent, element](const zoo::SafetensorsSource::Sink& write) {
                          const auto* data = static_cast<const uint8_t*>(local.raw_data());
                          ForEachRun(held, offset, extent, element,
                                     [&](int64_t at, size_t bytes) { write(data + at, bytes); });
                        }});
      }
    }
  }
  if (rank == 0) {
    fs::create_directories(dir);
    // What saves killed before left (this iteration's or any other's).
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("iter_", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
        fs::remove_all(e.path());
    }
    fs::create_directories(tmp);
  }
  comm.Barrier();
  const fs::path shard = tmp / ShardName(rank, world);
  // The save's id: a hash of the iteration and every chunk's checksum on
  // every rank. Another run's or iteration's shard differs; a resumed run
  // that reaches the same state writes the same bytes.
  {
    uint64_t local = Fnv1a(kFnvBasis, std::to_string(iteration));
    for (const auto& [entry, crc] : crcs) local = Fnv1a(Fnv1a(local, entry), crc);
    std::vector<uint64_t> all(static_cast<size_t>(world));
    comm.AllGather(&local, 1, all.data(), DType::kInt64);
    uint64_t id = kFnvBasis;
    for (uint64_t h : all) id = Fnv1a(id, std::to_string(h));
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(id));
    index.save_id = hex;
  }
  crcs[kSaveIdKey] = index.save_id;  // the shard's tie to this save's index
  zoo::WriteSafetensors(shard, mine, crcs);
  Fsync(shard);
  comm.Barrier();  // every shard is on disk
  MaybeKill("shards", rank);
  if (rank == 0) {
    WriteDurably(tmp / "index.json", IndexText(index));
    if (!options.config_text.empty()) WriteDurably(tmp / "config.prototxt", options.config_text);
    Fsync(tmp);
    MaybeKill("index", rank);
    if (fs::exists(final_dir)) {
      const fs::path old = dir / (IterationName(iteration) + ".old");
      fs::remove_all(old);
      fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      fs::remove_all(old);
    } else {
      fs::rename(tmp, final_dir);
    }
    Fsync(dir);
    MaybeKill("rename", rank);
    WriteDurably(dir / "latest.tmp", IterationName(iteration) + "\n");
    fs::rename(dir / "latest.tmp", dir / "latest");
    Fsync(dir);
    if (options.keep_last > 0) {
      std::vector<std::pair<int64_t, fs::path>> complete;
      for (const fs::directory_entry& e : fs::directory_iterator(dir))
        if (e.is_directory() && IterationOf(e.path()) >= 0 && fs::exists(e.path() / "index.json"))
          complete.emplace_back(IterationOf(e.path()), e.path());
      std::sort(complete.begin(), complete.end());
      for (size_t i = 0; i + options.keep_last < complete.size(); ++i)
        if (complete[i].second != final_dir) fs::remove_all(complete[i].second);
    }
  }
  comm.Barrier();  // nobody goes on (or exits) before the checkpoint is complete
  return final_dir;
}

DirectoryLock::DirectoryLock(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  TESSEL_CHECK(fs::is_directory(dir))
      << "checkpoint directory " << dir.string() << " cannot be made"
      << (fs::exists(dir) ? " (a file of that name is there)" : " (" + error.message() + ")")
      << "; give train.checkpoint_dir a directory";
  const fs::path lock = dir / ".lock";
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TESSEL_CHECK(fd_ >= 0) << "checkpoint directory " << dir.string() << ": cannot open " << lock.string()
                         << ": " << std::strerror(errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[256] = {};
    [[maybe_unused]] ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    TESSEL_THROW(StatusCode::kUnavailable)
        << "checkpoint directory " << dir.string() << " is being written by another job (" << holder
        << " holds " << lock.string() << "); give this run a train.checkpoint_dir of its own";
  }
  char host[128] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string owner = "pid " + std::to_string(::getpid()) + " on " + host;
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] ssize_t n = ::pwrite(fd_, owner.data(), owner.size(), 0);
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

fs::path Find(const fs::path& path) {
  if (fs::exists(path / "index.json")) return path;
  std::ifstream latest(path / "latest");
  std::string name;
  if (!latest || !std::getline(latest, name) || name.empty() || name.find('/') != std::string::npos)
    return {};
  return fs::exists(path / name / "index.json") ? path / name : fs::path();
}

CheckpointIndex ReadIndex(const fs::path& checkpoint) {
  const fs::path index_path = checkpoint / "index.json";
  std::error_code error;
  const uintmax_t size = fs::file_size(index_path, error);
  TESSEL_CHECK(!error) << "checkpoint: cannot read " << index_path.string() << " (" << error.message() << ")";
  TESSEL_CHECK(size <= kMaxIndexBytes) << "checkpoint: " << index_path.string() << " is " << size
                                       << " bytes; expected at most " << kMaxIndexBytes;
  std::ifstream in(index_path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseIndex(text, index_path.string());
}

struct Reader::Shard {
  std::unique_ptr<zoo::SafetensorsFile> file;
  int fd = -1;
  ~Shard() {
    if (fd >= 0) ::close(fd);
  }
};

Reader::Reader(const fs::path& checkpoint) : path_(checkpoint), index_(ReadIndex(checkpoint)) {}
Reader::~Reader() = default;

Reader::Shard& Reader::OpenShard(int file) {
  std::unique_ptr<Shard>& slot = shards_[file];
  if (!slot) {
    auto shard = std::make_unique<Shard>();
    const fs::path p = path_ / index_.files[static_cast<size_t>(file)];
    // The header through a mapping without read-ahead; chunks by pread with
    // read-ahead off, so the kernel reads the pages asked for and no more.
    shard->file = std::make_unique<zoo::SafetensorsFile>(p, zoo::SafetensorsFile::Access::kRandom);
    if (!index_.save_id.empty()) {
      const auto id = shard->file->metadata().find(kSaveIdKey);
      const std::string got = id == shard->file->metadata().end() ? "none" : id->second;
      TESSEL_CHECK(got == index_.save_id)
          << "checkpoint shard " << p.string() << " belongs to another save (save id " << got.substr(0, 32)
          << ") than its index " << (path_ / "index.json").string() << " (save id " << index_.save_id
          << "): a shard of another run or iteration was put here; restore this checkpoint's own shards";
    }
    shard->fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    TESSEL_CHECK(shard->fd >= 0) << "checkpoint: cannot open " << p.string() << ": " << std::strerror(errno);
    ::posix_fadvise(shard->fd, 0, 0, POSIX_FADV_RANDOM);
    slot = std::move(shard);
  }
  return *slot;
}

struct Reader::Piece {
  Box box;
  int file;
  uint64_t offset, bytes;
  std::string where, crc;
  const uint8_t* data = nullptr;  // in its read's buffer
};

std::vector<Reader::Piece> Reader::Plan(const std::string& name, const Box& box, size_t* element) {
  const auto it = index_.tensors.find(name);
  TESSEL_CHECK(it != index_.tensors.end())
      << "checkpoint " << path_.string() << " has no tensor '" << name << "' (of " << index_.tensors.size()
      << " tensors; a checkpoint of another model?)";
  const SavedTensor& saved = it->second;
  *element = zoo::SafetensorsElementSize(saved.dtype);
  std::vector<Piece> pieces;
  for (const SavedBox& b : saved.boxes) {
    if (box.Intersect(b.box).empty()) continue;
    const zoo::SafetensorsFile& file = *OpenShard(b.file).file;
    // A shard holds no more chunks than entries: an index claiming more is damaged.
    for (const Chunk& chunk :
         ChunksOverlapping(name, b, box, static_cast<int64_t>(std::max<size_t>(file.entries().size(), 1)))) {
      std::string where = "checkpoint shard " + file.path().string() + ": tensor '" + name + "'" +
                          (chunk.entry == name ? "" : " (chunk '" + chunk.entry + "')");
      TESSEL_CHECK(file.contains(chunk.entry))
          << where << " is missing (the index says this shard holds its box " << chunk.box.ToString() << ")";
      const zoo::SafetensorsEntry& entry = file.entry(chunk.entry);
      TESSEL_CHECK(entry.dtype == saved.dtype && entry.shape == Dims(chunk.box.shape()))
          << where << " is " << entry.dtype << " " << Shape(entry.shape) << "; the index says " << saved.dtype
          << " " << chunk.box.shape();
      const auto crc = file.metadata().find(CrcKey(chunk.entry));
      TESSEL_CHECK(crc != file.metadata().end()) << where << " has no checksum";
      pieces.push_back({chunk.box, b.file, file.file_offset(chunk.entry), entry.end - entry.begin,
                        std::move(where), crc->second});
    }
  }
  return pieces;
}

void Reader::ReadBox(const std::string& name, const Box& box, void* out) {
  size_t element = 0;
  std::vector<Piece> pieces = Plan(name, box, &element);
  ReadPieces(pieces, name, box, element, out);
}

void Reader::ReadPieces(std::vector<Piece>& pieces, const std::string& name, const Box& box, size_t element,
                        void* out) {
  // Chunks that follow each other in a shard are read with one pread (a
  // whole box is one read), up to 64 MiB at a time; every chunk is checked
  // before any byte goes to `out`.
  std::vector<Piece*> order;
  for (Piece& p : pieces) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](const Piece* a, const Piece* b) {
    return std::tie(a->file, a->offset) < std::tie(b->file, b->offset);
  });
  constexpr uint64_t kMaxRead = uint64_t{64} << 20;
  uint64_t total = 0;
  for (const Piece& p : pieces) total += p.bytes;
  if (total > scratch_bytes_) {
    scratch_.reset(new uint8_t[total]);
    scratch_bytes_ = total;
  }
  // The reads: [first, last) of `order` each, one pread.
  std::vector<std::pair<size_t, size_t>> reads;
  for (size_t first = 0; first < order.size();) {
    size_t last = first + 1;
    uint64_t span = order[first]->bytes;
    while (last < order.size() && order[last]->file == order[first]->file &&
           order[last]->offset == order[first]->offset + span && span + order[last]->bytes <= kMaxRead)
      span += order[last++]->bytes;
    reads.emplace_back(first, last);
    first = last;
  }
  auto span_of = [&](const std::pair<size_t, size_t>& r) {
    return order[r.second - 1]->offset + order[r.second - 1]->bytes - order[r.first]->offset;
  };
  uint8_t* next = scratch_.get();
  for (size_t i = 0; i < reads.size(); ++i) {
    const auto [first, last] = reads[i];
    const uint64_t span = span_of(reads[i]);
    // The next read's pages are asked for now (exactly those: read-ahead is
    // off), so the disk works while this one is checked and copied.
    if (i + 1 < reads.size()) {
      const Piece& ahead = *order[reads[i + 1].first];
      ::posix_fadvise(OpenShard(ahead.file).fd, static_cast<off_t>(ahead.offset),
                      static_cast<off_t>(span_of(reads[i + 1])), POSIX_FADV_WILLNEED);
    }
    const Shard& shard = OpenShard(order[first]->file);
    uint8_t* buffer = next;
    next += span;
    for (uint64_t done = 0; done < span;) {
      const ssize_t got =
          ::pread(shard.fd, buffer + done, span - done, static_cast<off_t>(order[first]->offset + done));
      if (got < 0 && errno == EINTR) continue;
      TESSEL_CHECK(got > 0) << order[first]->where << ": cannot read " << span << " bytes at offset "
                            << order[first]->offset + done << ": "
                            << (got < 0 ? std::strerror(errno) : "end of file");
      done += static_cast<uint64_t>(got);
    }
    for (size_t i = first; i < last; ++i) {
      Piece& p = *order[i];
      p.data = buffer + (p.offset - order[first]->offset);
      const uint32_t actual = zoo::Crc32c(std::string_view(reinterpret_cast<const char*>(p.data), p.bytes));
      TESSEL_CHECK(std::to_string(actual) == p.crc) << p.where << ": checksum mismatch (CRC-32C " << actual
                                                    << ", saved " << p.crc << "); the file is damaged";
    }
    stats_.bytes_read += static_cast<int64_t>(span);
  }
  stats_.chunks_read += static_cast<int64_t>(pieces.size());
  int64_t copied = 0;
  for (const Piece& p : pieces) {
    const Box overlap = box.Intersect(p.box);
    CopyBox(p.data, Dims(p.box.shape()), overlap.OffsetIn(p.box), out, Dims(box.shape()),
            overlap.OffsetIn(box), Dims(overlap.shape()), element);
    copied += overlap.numel();
  }
  TESSEL_CHECK(copied == box.numel())
      << "checkpoint " << path_.string() << ": tensor '" << name << "': the saved boxes cover " << copied
      << " of the " << box.numel() << " elements of " << box.ToString();
  stats_.bytes_needed += box.numel() * static_cast<int64_t>(element);
}

Tensor Reader::ReadTensor(const std::string& name) {
  const auto it = index_.tensors.find(name);
  TESSEL_CHECK(it != index_.tensors.end())
      << "checkpoint " << path_.string() << " has no tensor '" << name << "'";
  const Box whole = Box::Full(Shape(it->second.shape));
  size_t element = 0;
  std::vector<Piece> pieces = Plan(name, whole, &element);  // before allocating what the index claims
  Tensor t =
      Tensor::Empty(Shape(it->second.shape),
                    zoo::DTypeOfSafetensors(it->second.dtype, "tensor '" + name + "' of " + path_.string()));
  ReadPieces(pieces, name, whole, element, t.raw_data());
  return t;
}

std::optional<config::Config> SavedConfig(const fs::path& checkpoint) {
  const fs::path path = checkpoint / "config.prototxt";
  if (!fs::exists(path)) return std::nullopt;
  return zoo::LoadConfig(path.string());  // size-checked, then parsed
}

std::map<std::string, std::string> Load(const fs::path& checkpoint, const NamedTensors& tensors,
                                        const LoadOptions& options) {
  Reader reader(checkpoint);
  const CheckpointIndex& index = reader.index();
  const int rank = CurrentRank();
  // Every tensor is checked against the index before any is written.
  for (const auto& [name, t] : tensors) {
    const auto it = index.tensors.find(name);
    TESSEL_CHECK(it != index.tensors.end())
        << "checkpoint " << checkpoint.string() << " has no tensor '" << name << "' (of "
        << index.tensors.size() << " tensors; a checkpoint of another model?)";
    std::vector<int64_t> saved_shape = it->second.shape;
    const std::vector<int64_t> model_shape = Dims(t->shape());
    const auto padded = options.padded_rows.find(name);
    // Rows past the real ones are padding: their count may differ.
    if (padded != options.padded_rows.end() && !saved_shape.empty() && !model_shape.empty() &&
        saved_shape[0] >= padded->second && model_shape[0] >= padded->second)
      saved_shape[0] = model_shape[0];
    TESSEL_CHECK(saved_shape == model_shape)
        << "checkpoint " << checkpoint.string() << ": tensor '" << name << "' has shape "
        << Shape(it->second.shape) << " there but " << t->shape() << " in the model";
    TESSEL_CHECK(it->second.dtype == zoo::SafetensorsDType(t->dtype()))
        << "checkpoint " << checkpoint.string() << ": tensor '" << name << "' is " << it->second.dtype
        << " there but " << zoo::SafetensorsDType(t->dtype()) << " in the model";
  }
  for (const auto& [name, t] : tensors) {
    if (t->is_global() && !t->placement().Contains(rank)) continue;
    const SavedTensor& saved = index.tensors.at(name);
    const Box held = HeldBox(*t, rank);
    // Padding rows that the checkpoint lacks keep the model's values.
    Box need = held;
    if (options.padded_rows.count(name) && need.ndim() > 0)
      need[0].end = std::max(need[0].begin, std::min(need[0].end, saved.shape[0]));
    if (need.empty()) continue;
    const size_t element = ElementSize(t->dtype());
    // Read on the host (a GPU shard through a host copy of it, so rows the
    // checkpoint lacks keep their values), then copied back to the device.
    Tensor target = t->to_local();
    Tensor local = target.device().is_cpu() ? target : target.To(Device::CPU());
    if (need == held) {
      reader.ReadBox(name, need, local.raw_data());
    } else {
      std::vector<uint8_t> part(static_cast<size_t>(need.numel()) * element);
      reader.ReadBox(name, need, part.data());
      CopyBox(part.data(), Dims(need.shape()), std::vector<int64_t>(need.ndim(), 0), local.raw_data(),
              Dims(held.shape()), need.OffsetIn(held), Dims(need.shape()), element);
    }
    if (!target.device().is_cpu()) target.CopyFrom(local);
  }
  if (options.stats != nullptr) *options.stats = reader.stats();
  return index.metadata;
}

}  // namespace tessel::checkpoint
