#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/box_copy.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "sbp/global_tensor.h"
#include "sbp/placement.h"
#include "zoo/event_writer.h"
#include "zoo/safetensors.h"

namespace tessel::checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "tessel.checkpoint";
constexpr int kVersion = 1;
constexpr uint64_t kMaxIndexBytes = 1ull << 30;
constexpr int64_t kMaxDim = int64_t{1} << 48;
constexpr size_t kMaxBoxes = 1 << 16;  // per tensor: one per distinct shard of the saving job at most

std::string IterationName(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07ld", static_cast<long>(iteration));
  return name;
}

std::string ShardName(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof(name), "shard-%05d-of-%05d.safetensors", rank, world);
  return name;
}

std::string CrcKey(const std::string& tensor) { return "crc32c:" + tensor; }

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

CheckpointIndex ParseIndex(std::string_view text, const std::string& name) {
  TESSEL_CHECK(text.size() <= kMaxIndexBytes)
      << "checkpoint index " << name << ": " << text.size() << " bytes; expected at most " << kMaxIndexBytes;
  const nlohmann::json j =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  TESSEL_CHECK(j.is_object()) << "checkpoint index " << name << " is not a JSON object";
  TESSEL_CHECK(j.contains("format") && j["format"] == kFormat)
      << "checkpoint index " << name << " is not a tessel checkpoint index (its \"format\" is not \""
      << kFormat << "\")";
  TESSEL_CHECK(j.contains("version") && j["version"] == kVersion)
      << "checkpoint index " << name << ": version "
      << (j.contains("version") ? j["version"].dump() : "missing") << "; expected " << kVersion;
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
      SavedBox saved{static_cast<int>(b["file"].get<uint64_t>()), Box(std::move(ranges))};
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
      e["boxes"].push_back({{"file", b.file}, {"begin", begin}, {"end", end}});
    }
    j["tensors"][name] = std::move(e);
  }
  return j.dump(1);
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
  std::vector<std::pair<std::string, Tensor>> mine;
  std::map<std::string, std::string> crcs;
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
    for (auto& [writer, box] : Writers(*t)) {
      saved.boxes.push_back({writer, box});
      if (writer != rank) continue;
      Tensor local = t->to_local().To(Device::CPU());  // a GPU shard is written from a host copy
      mine.emplace_back(name, local);
      const char* bytes = static_cast<const char*>(local.raw_data());
      crcs[CrcKey(name)] = std::to_string(zoo::Crc32c(std::string_view(bytes, local.nbytes())));
    }
  }
  if (rank == 0) {
    fs::create_directories(dir);
    fs::remove_all(tmp);  // a save killed before
    fs::create_directories(tmp);
  }
  comm.Barrier();
  const fs::path shard = tmp / ShardName(rank, world);
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

std::map<std::string, std::string> Load(const fs::path& checkpoint, const NamedTensors& tensors,
                                        const LoadOptions& options) {
  const CheckpointIndex index = ReadIndex(checkpoint);
  const int rank = CurrentRank();
  std::map<int, std::unique_ptr<zoo::SafetensorsFile>> shards;
  auto shard = [&](int file) -> const zoo::SafetensorsFile& {
    auto& slot = shards[file];
    if (!slot)
      slot = std::make_unique<zoo::SafetensorsFile>(checkpoint / index.files[static_cast<size_t>(file)]);
    return *slot;
  };
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
    const size_t element = ElementSize(t->dtype());
    // The saved boxes this rank reads, checked first.
    std::vector<std::pair<const SavedBox*, std::span<const uint8_t>>> sources;
    for (const SavedBox& b : saved.boxes) {
      if (need.Intersect(b.box).empty()) continue;
      const zoo::SafetensorsFile& file = shard(b.file);
      const std::string where = "checkpoint shard " + file.path().string() + ": tensor '" + name + "'";
      TESSEL_CHECK(file.contains(name))
          << where << " is missing (the index says this shard holds its box " << b.box.ToString() << ")";
      const zoo::SafetensorsEntry& entry = file.entry(name);
      TESSEL_CHECK(entry.dtype == saved.dtype && entry.shape == Dims(b.box.shape()))
          << where << " is " << entry.dtype << " " << Shape(entry.shape) << "; the index says " << saved.dtype
          << " " << b.box.shape();
      const std::span<const uint8_t> bytes = file.bytes(name);
      const auto crc = file.metadata().find(CrcKey(name));
      TESSEL_CHECK(crc != file.metadata().end()) << where << " has no checksum";
      const uint32_t actual =
          zoo::Crc32c(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
      TESSEL_CHECK(std::to_string(actual) == crc->second)
          << where << ": checksum mismatch (CRC-32C " << actual << ", saved " << crc->second
          << "); the file is damaged";
      sources.emplace_back(&b, bytes);
    }
    // Filled on the host (a GPU shard through a host copy of it, so rows the
    // checkpoint lacks keep their values), then copied back to the device.
    Tensor target = t->to_local();
    Tensor local = target.device().is_cpu() ? target : target.To(Device::CPU());
    int64_t copied = 0;
    for (const auto& [b, bytes] : sources) {
      const Box overlap = need.Intersect(b->box);
      CopyBox(bytes.data(), Dims(b->box.shape()), overlap.OffsetIn(b->box), local.raw_data(),
              Dims(held.shape()), overlap.OffsetIn(held), Dims(overlap.shape()), element);
      copied += overlap.numel();
    }
    TESSEL_CHECK(copied == need.numel())
        << "checkpoint " << checkpoint.string() << ": tensor '" << name << "': the saved boxes cover "
        << copied << " of the " << need.numel() << " elements of " << need.ToString();
    if (!target.device().is_cpu()) target.CopyFrom(local);
  }
  return index.metadata;
}

}  // namespace tessel::checkpoint
