// tessel-checkpoint: looks into, merges and splits tessel's distributed
// checkpoints (checkpoint/checkpoint.h).
//
//   tessel-checkpoint info CHECKPOINT               iteration, layout, each tensor's shape and boxes
//   tessel-checkpoint merge CHECKPOINT OUT.safetensors [--model_only]
//                                                   every tensor whole in one safetensors file
//   tessel-checkpoint split IN.safetensors DIR      one safetensors file (tessel names) as a
//                                                   checkpoint in DIR, loadable under any layout
//   tessel-checkpoint import-hf HF_DIR DIR          a Hugging Face GPT-2, Llama, T5, BERT or ViT
//   (save_pretrained's
//                                                   directory) as a checkpoint in DIR, for
//                                                   train.load_weight; prints the config's model block
//   tessel-checkpoint export-hf CHECKPOINT HF_DIR [--tokenizer DIR]
//                                                   a checkpoint's model as a Hugging Face directory
//                                                   (config.json, model.safetensors) for from_pretrained;
//                                                   with a GPT-2's tokenizer files too, for AutoTokenizer
//
// CHECKPOINT is a checkpoint directory (with index.json) or a directory of
// them (its `latest`). merge keeps the index's metadata (iteration, arch)
// in the file's; split gives it back, so a merged checkpoint resumes.
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hugging_face.h"
#include "checkpoint/hugging_face_tokenizer.h"
#include "core/error.h"
#include "zoo/config.h"
#include "zoo/safetensors.h"

DEFINE_bool(model_only, false, "merge: only the model's tensors (model.*), not the optimizer state");
DEFINE_string(tokenizer, "",
              "export-hf of a GPT-2: the directory of the tokenizer the data was made with (vocab.json and "
              "merges.txt, e.g. data/tiny_corpus): copied beside the model with tokenizer_config.json and "
              "special_tokens_map.json, and its <|endoftext|> id written as config.json's bos_token_id and "
              "eos_token_id, so AutoTokenizer and generate() work");

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

int ImportHf(const std::string& hf_dir, const std::string& dir) {
  checkpoint::HuggingFaceImport imported = checkpoint::ReadHuggingFace(hf_dir);
  checkpoint::NamedTensors named;
  for (auto& [name, t] : imported.tensors) named.emplace_back("model." + name, &t);
  config::Config c;
  *c.mutable_model() = imported.model;
  checkpoint::SaveOptions options;
  options.keep_last = 0;
  options.config_text = zoo::ConfigText(c);
  const std::filesystem::path saved = checkpoint::Save(
      dir, 0, named,
      {{"iteration", "0"}, {"arch", imported.model.arch()}, {"source", "huggingface:" + hf_dir}}, options);
  std::printf(
      "tessel-checkpoint: imported %zu tensors of %s (%s) as %s\n"
      "Train from it with train.load_weight: \"%s\" and this model block in the config:\n%s",
      named.size(), hf_dir.c_str(), imported.model.arch().c_str(), saved.c_str(), dir.c_str(),
      zoo::ConfigText(c).c_str());
  return 0;
}

int ExportHf(const std::string& path, const std::string& hf_dir) {
  const std::filesystem::path found = FindOrFail(path);
  checkpoint::Reader reader(found);
  const std::optional<config::Config> saved = checkpoint::SavedConfig(found);
  TESSEL_CHECK(saved.has_value())
      << "tessel-checkpoint: " << found.string()
      << " has no config.prototxt, so its model's sizes are unknown (tessel-train and import-hf write one)";
  config::ModelConfig model = saved->model();
  model.set_arch(zoo::CanonicalArch(model.arch()));
  const auto arch = reader.index().metadata.find("arch");
  TESSEL_CHECK(arch == reader.index().metadata.end() || zoo::CanonicalArch(arch->second) == model.arch())
      << "tessel-checkpoint: " << found.string() << " is of arch '" << arch->second
      << "' but its config says '" << model.arch() << "'";
  // A ViT's num_classes 0 means "the dataset's count": the head says it.
  const auto head = reader.index().tensors.find("model.head.weight");
  if (model.arch() == "vit" && model.num_classes() == 0 && head != reader.index().tensors.end() &&
      head->second.shape.size() == 2)
    model.set_num_classes(head->second.shape[1]);
  // Every model tensor must have its place in Hugging Face's model.
  const std::vector<std::string> mapped = checkpoint::HuggingFaceMappedParameters(model);
  std::vector<std::string> unmapped;
  for (const auto& [name, t] : reader.index().tensors)
    if (name.rfind("model.", 0) == 0 &&
        std::find(mapped.begin(), mapped.end(), name.substr(6)) == mapped.end())
      unmapped.push_back(name);
  TESSEL_CHECK(unmapped.empty()) << "tessel-checkpoint: " << found.string() << " holds " << unmapped.size()
                                 << " model tensor(s) Hugging Face's " << model.arch()
                                 << " has no place for, first '" << (unmapped.empty() ? "" : unmapped[0])
                                 << "' (a BERT sequence classifier?); nothing was written";
  TESSEL_CHECK(FLAGS_tokenizer.empty() || model.arch() == "gpt2")
      << "tessel-checkpoint: --tokenizer is for a GPT-2's byte-level BPE; this checkpoint is a "
      << model.arch();
  // Read before anything is written: a bad tokenizer leaves no half export.
  std::optional<checkpoint::Gpt2Tokenizer> tokenizer;
  if (!FLAGS_tokenizer.empty())
    tokenizer = checkpoint::ReadGpt2Tokenizer(FLAGS_tokenizer, model.vocab_size());
  // A T5 stops generating at its data's end-of-sequence id.
  std::optional<int64_t> eos;
  if (model.arch() == "t5" && saved->data().eos_token_id() >= 0) eos = saved->data().eos_token_id();
  checkpoint::WriteHuggingFace(
      hf_dir, model, [&](const std::string& name) { return reader.ReadTensor("model." + name); }, eos);
  if (tokenizer) checkpoint::WriteGpt2Tokenizer(hf_dir, *tokenizer);
  std::printf(
      "tessel-checkpoint: exported the %s of %s to %s (config.json, model.safetensors%s)\n",
      model.arch().c_str(), found.c_str(), hf_dir.c_str(),
      tokenizer
          ? (", the tokenizer; <|endoftext|> is id " + std::to_string(tokenizer->end_of_text_id)).c_str()
          : "");
  if (!tokenizer && model.arch() == "gpt2")
    std::printf(
        "tessel-checkpoint: no --tokenizer given: AutoTokenizer will not load this directory, and "
        "generate() knows no end-of-text id; pass the directory of the data's vocab.json and merges.txt\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "tessel-checkpoint info CHECKPOINT | merge CHECKPOINT OUT.safetensors [--model_only] | split "
      "IN.safetensors DIR | import-hf HF_DIR DIR | export-hf CHECKPOINT HF_DIR [--tokenizer DIR]\n"
      "  info       the iteration, the saving layout, each tensor's shape, layout and boxes\n"
      "  merge      every tensor whole, in one safetensors file (tessel's names)\n"
      "  split      one safetensors file as a one-shard checkpoint, loadable under any layout\n"
      "  import-hf  a Hugging Face GPT-2, Llama, T5, BERT or ViT directory (save_pretrained, safetensors) as "
      "a\n"
      "             checkpoint for train.load_weight; prints the model block its config needs\n"
      "  export-hf  a checkpoint's model as a Hugging Face directory (config.json, model.safetensors; with\n"
      "             --tokenizer, a GPT-2's tokenizer files too)");
  tessel::Init(&argc, &argv);
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() == 2 && a[0] == "info") return Info(a[1]);
  if (a.size() == 3 && a[0] == "merge") return Merge(a[1], a[2]);
  if (a.size() == 3 && a[0] == "split") return Split(a[1], a[2]);
  if (a.size() == 3 && a[0] == "import-hf") return ImportHf(a[1], a[2]);
  if (a.size() == 3 && a[0] == "export-hf") return ExportHf(a[1], a[2]);
  std::fprintf(stderr, "%s\n", gflags::ProgramUsage());
  return 2;
}
