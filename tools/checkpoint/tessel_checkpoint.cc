// tessel-checkpoint: looks into, merges and splits tessel's distributed
// checkpoints (checkpoint/checkpoint.h).
//
//   tessel-checkpoint info CHECKPOINT               iteration, layout, each tensor's shape and boxes
//   tessel-checkpoint merge CHECKPOINT OUT.safetensors [--model_only]
//                                                   every tensor whole in one safetensors file
//   tessel-checkpoint split IN.safetensors DIR      one safetensors file (tessel names) as a
//                                                   checkpoint in DIR, loadable under any layout
//
// CHECKPOINT is a checkpoint directory (with index.json) or a directory of
// them (its `latest`). merge keeps the index's metadata (iteration, arch)
// in the file's; split gives it back, so a merged checkpoint resumes.
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "zoo/safetensors.h"

DEFINE_bool(model_only, false, "merge: only the model's tensors (model.*), not the optimizer state");

using namespace tessel;

namespace {

std::filesystem::path FindOrFail(const std::string& path) {
  const std::filesystem::path found = checkpoint::Find(path);
  TESSEL_CHECK(!found.empty()) << "tessel-checkpoint: " << path
                               << " is no checkpoint (a directory with index.json, or `latest` naming one)";
  return found;
}

int Info(const std::string& path) {
  const std::filesystem::path found = FindOrFail(path);
  const checkpoint::CheckpointIndex index = checkpoint::ReadIndex(found);
  std::printf("%s: %zu tensors in %zu shards (saved by %d ranks)\n", found.c_str(), index.tensors.size(),
              index.files.size(), index.world_size);
  for (const auto& [k, v] : index.metadata) std::printf("  %s: %s\n", k.c_str(), v.c_str());
  for (const auto& [name, t] : index.tensors) {
    std::printf("%s %s %s", name.c_str(), t.dtype.c_str(), Shape(t.shape).ToString().c_str());
    if (!t.placement.empty()) std::printf(" on %s as %s", t.placement.c_str(), t.nd_sbp.c_str());
    std::printf(":");
    for (const checkpoint::SavedBox& b : t.boxes) std::printf(" %s@%d", b.box.ToString().c_str(), b.file);
    std::printf("\n");
  }
  return 0;
}

// Streams: each tensor is read whole when its turn to be written comes, so
// merging needs the memory of one tensor, not of the checkpoint.
int Merge(const std::string& path, const std::string& out) {
  const std::filesystem::path found = FindOrFail(path);
  checkpoint::Reader reader(found);
  std::vector<zoo::SafetensorsSource> sources;
  for (const auto& [name, t] : reader.index().tensors) {
    if (FLAGS_model_only && name.rfind("model.", 0) != 0) continue;
    sources.push_back({name, t.dtype, t.shape, [&reader, name](const zoo::SafetensorsSource::Sink& write) {
                         const Tensor whole = reader.ReadTensor(name);
                         write(whole.raw_data(), whole.nbytes());
                       }});
  }
  zoo::WriteSafetensors(out, sources, reader.index().metadata);
  std::printf("tessel-checkpoint: merged %zu tensors of %s into %s\n", sources.size(), found.c_str(),
              out.c_str());
  return 0;
}

int Split(const std::string& in, const std::string& dir) {
  const zoo::SafetensorsFile file(in);
  std::vector<Tensor> tensors;
  tensors.reserve(file.entries().size());
  checkpoint::NamedTensors named;
  for (const auto& [name, entry] : file.entries()) tensors.push_back(file.tensor(name));
  size_t i = 0;
  for (const auto& [name, entry] : file.entries()) named.emplace_back(name, &tensors[i++]);
  std::map<std::string, std::string> metadata = file.metadata();
  const auto iteration = metadata.find("iteration");
  const int64_t at = iteration == metadata.end() ? 0 : std::stoll(iteration->second);
  metadata["iteration"] = std::to_string(at);
  checkpoint::SaveOptions options;
  options.keep_last = 0;
  const std::filesystem::path saved = checkpoint::Save(dir, at, named, metadata, options);
  std::printf("tessel-checkpoint: wrote %zu tensors of %s as %s\n", named.size(), in.c_str(), saved.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "tessel-checkpoint info CHECKPOINT | merge CHECKPOINT OUT.safetensors [--model_only] | split "
      "IN.safetensors DIR\n"
      "  info   the iteration, the saving layout, each tensor's shape, layout and boxes\n"
      "  merge  every tensor whole, in one safetensors file (tessel's names)\n"
      "  split  one safetensors file as a one-shard checkpoint, loadable under any layout");
  tessel::Init(&argc, &argv);
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() == 2 && a[0] == "info") return Info(a[1]);
  if (a.size() == 3 && a[0] == "merge") return Merge(a[1], a[2]);
  if (a.size() == 3 && a[0] == "split") return Split(a[1], a[2]);
  std::fprintf(stderr, "%s\n", gflags::ProgramUsage());
  return 2;
}
