// tessel-dataset: looks into and writes Megatron-format indexed datasets
// (<prefix>.bin / <prefix>.idx, zoo/indexed_dataset.h).
//
//   tessel-dataset info PREFIX            counts, dtype, largest token id
//   tessel-dataset dump PREFIX            one line per sequence: its token ids
//   tessel-dataset write PREFIX DTYPE     one document per stdin line of ids
//                                         (DTYPE: uint8 int8 int16 uint16 int32 int64)
//   tessel-dataset samples CONFIG [--split train|validation] [--first N] [--count K]
//                          [--world_size W] [--set path=value ...]
//                                         a GPT-2, Llama or T5 config's samples as
//                                         training (or evaluation) reads them: index,
//                                         iteration, row, ids (T5: the encoder's inputs
//                                         and the targets after span corruption), and
//                                         the text with data.vocab_file
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hugging_face_tokenizer.h"
#include "core/error.h"
#include "zoo/config.h"
#include "zoo/gpt_samples.h"
#include "zoo/indexed_dataset.h"
#include "zoo/t5_samples.h"
#include "zoo/vocabulary.h"

using namespace tessel;

namespace {

const std::map<std::string, zoo::TokenDType> kDTypes = {
    {"uint8", zoo::TokenDType::kUInt8}, {"int8", zoo::TokenDType::kInt8},
    {"int16", zoo::TokenDType::kInt16}, {"uint16", zoo::TokenDType::kUInt16},
    {"int32", zoo::TokenDType::kInt32}, {"int64", zoo::TokenDType::kInt64}};

int Usage() {
  std::fprintf(
      stderr,
      "usage: tessel-dataset info PREFIX | dump PREFIX | write PREFIX DTYPE < ids | samples CONFIG "
      "[options]\n"
      "  info     counts, dtype and the largest token id of <PREFIX>.bin/.idx\n"
      "  dump     one line per sequence: its token ids, space-separated\n"
      "  write    one document per stdin line of token ids; DTYPE is uint8, int8, int16, uint16, int32 "
      "or int64\n"
      "  samples  a GPT-2 or Llama training config's samples as tessel-train reads them, one per line: its "
      "index, iteration and row of the global batch, its seq + 1 token ids (the text too with "
      "data.vocab_file); a T5 config's: the encoder's inputs and the targets after span corruption;\n"
      "           --split train|validation (train; validation: evaluation's, \"iteration\" its batch), "
      "--first N (0), --count K (the first global batch), --world_size W (the config's ranks), --set "
      "path=value (repeatable)\n");
  return 2;
}

// A number given to a `samples` option, in [low, high]; throws naming the option.
int64_t Count(const std::string& option, const std::string& text, int64_t low,
              int64_t high = std::numeric_limits<int64_t>::max()) {
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TESSEL_CHECK(used == text.size() && used > 0 && value >= low && value <= high)
      << "tessel-dataset samples: " << option << " '" << text << "'; expected an integer from " << low
      << (high == std::numeric_limits<int64_t>::max() ? std::string(" up") : " to " + std::to_string(high));
  return value;
}

int Samples(int argc, char** argv) {
  if (argc < 3) return Usage();
  std::string split = "train";
  int64_t first = 0, count = -1, world = 0;
  std::vector<std::string> overrides;
  for (int i = 3; i < argc; ++i) {
    const std::string option = argv[i];
    TESSEL_CHECK(i + 1 < argc) << "tessel-dataset samples: " << option << " needs a value";
    const std::string value = argv[++i];
    if (option == "--split") {
      split = value;
    } else if (option == "--first") {
      first = Count(option, value, 0);
    } else if (option == "--count") {
      count = Count(option, value, 0);
    } else if (option == "--world_size") {
      world = Count(option, value, 1, int64_t{1} << 20);
    } else if (option == "--set") {
      overrides.push_back(value);
    } else {
      TESSEL_CHECK(false) << "tessel-dataset samples: unknown option '" << option
                          << "'; expected --split, --first, --count, --world_size or --set";
    }
  }
  TESSEL_CHECK(split == "train" || split == "validation")
      << "tessel-dataset samples: --split '" << split << "'; expected train or validation";
  config::Config c = zoo::LoadConfig(argv[2]);
  zoo::ApplyOverrides(&c, overrides);
  if (world == 0) world = zoo::WorldSizeOf(c.train().dist());
  zoo::ResolveConfig(&c, static_cast<int>(world));
  const std::string& arch = c.model().arch();
  TESSEL_CHECK(arch == "gpt2" || arch == "llama" || arch == "t5")
      << "tessel-dataset samples: configs of token models read as GPT-2, Llama and T5 read them; this one's "
         "model.arch is '"
      << arch << "'";
  const bool validation = split == "validation";
  TESSEL_CHECK(!validation || c.evaluation().enabled())
      << "tessel-dataset samples: --split validation, but the config's evaluation.enabled is false";
  const int64_t global = c.train().global_batch_size(), seq = c.model().max_seq_length();
  const int which = validation ? 1 : 0;
  const int64_t total = (validation ? c.evaluation().eval_iter() : c.train().train_iter()) * global;
  const uint64_t seed = c.train().seed() + (validation ? 1 : 0);
  std::vector<double> weights;
  const auto corpora = zoo::OpenCorpora(c.data(), &weights);
  std::vector<std::string> vocabulary;
  if (!c.data().vocab_file().empty() && std::filesystem::path(c.data().vocab_file()).extension() == ".json")
    vocabulary = zoo::ReadVocabulary(c.data().vocab_file());
  if (count < 0) count = global;
  auto print = [&](const char* label, const std::vector<int64_t>& tokens) {
    std::printf("%s", label);
    for (int64_t id : tokens) std::printf(" %ld", static_cast<long>(id));
    std::printf("\n");
    if (vocabulary.empty()) return;
    bool known = true;
    for (int64_t id : tokens) known &= id >= 0 && static_cast<size_t>(id) < vocabulary.size();
    if (known) std::printf("  text: %s\n", checkpoint::DecodeGpt2(vocabulary, tokens).c_str());
  };
  auto where = [&](int64_t i) {
    std::printf("sample %ld (%s %ld, row %ld):", static_cast<long>(i), validation ? "batch" : "iteration",
                static_cast<long>(i / global + (validation ? 0 : 1)), static_cast<long>(i % global));
  };
  if (arch == "t5") {
    const zoo::T5Samples samples(corpora, weights, which, zoo::SpanCorruptionOptionsOf(c), seq, total, seed,
                                 split);
    const zoo::SpanCorruptedLengths& l = samples.lengths();
    std::printf(
        "%s samples of %s: %s; global batch %ld; span corruption of %ld tokens: encoder %ld, decoder %ld "
        "(%ld spans, sentinels %ld..%ld)\n",
        split.c_str(), argv[2], samples.Summary(corpora, which).c_str(), static_cast<long>(global),
        static_cast<long>(samples.raw_length()), static_cast<long>(l.inputs), static_cast<long>(l.targets),
        static_cast<long>(l.spans), static_cast<long>(samples.options().vocab_size - l.spans),
        static_cast<long>(samples.options().vocab_size - 1));
    for (int64_t i = first; i < first + count; ++i) {
      const zoo::SpanCorrupted corrupted = samples.Sample(i);
      where(i);
      std::printf("\n");
      print("  inputs:", corrupted.inputs);
      print("  targets:", corrupted.targets);
    }
    return 0;
  }
  const zoo::GPTSamples samples(corpora, weights, which, seq, total, seed, split);
  std::printf(
      "%s samples of %s: %s; global batch %ld, %ld tokens each (ids: the first %ld, labels: the last %ld)\n",
      split.c_str(), argv[2], samples.Summary(corpora, which).c_str(), static_cast<long>(global),
      static_cast<long>(seq + 1), static_cast<long>(seq), static_cast<long>(seq));
  std::vector<int64_t> tokens;
  for (int64_t i = first; i < first + count; ++i) {
    tokens.clear();
    samples.Sample(i % samples.size(), &tokens);
    where(i);
    print("", tokens);
  }
  return 0;
}

int Run(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string command = argv[1], prefix = argv[2];
  if (command == "info" && argc == 3) {
    zoo::IndexedDataset data(prefix);
    int64_t tokens = 0;
    for (size_t i = 0; i < data.num_sequences(); ++i) tokens += data.sequence_length(i);
    std::printf("sequences %zu documents %zu tokens %ld dtype_code %d max_token %ld\n", data.num_sequences(),
                data.num_documents(), static_cast<long>(tokens), static_cast<int>(data.dtype()),
                static_cast<long>(data.MaxToken()));
    return 0;
  }
  if (command == "dump" && argc == 3) {
    zoo::IndexedDataset data(prefix);
    std::vector<int64_t> ids;
    for (size_t k = 0; k < data.num_documents(); ++k) {
      for (int64_t i = data.document_begin(k); i < data.document_end(k); ++i) {
        ids.clear();
        data.Read(static_cast<size_t>(i), 0, data.sequence_length(static_cast<size_t>(i)), &ids);
        std::printf("%zu:", k);
        for (int64_t id : ids) std::printf(" %ld", static_cast<long>(id));
        std::printf("\n");
      }
    }
    return 0;
  }
  if (command == "samples") return Samples(argc, argv);
  if (command == "write" && argc == 4) {
    auto dtype = kDTypes.find(argv[3]);
    TESSEL_CHECK(dtype != kDTypes.end()) << "tessel-dataset write: dtype '" << argv[3]
                                         << "'; expected uint8, int8, int16, uint16, int32 or int64";
    zoo::IndexedDatasetWriter writer(prefix, dtype->second);
    int line_number = 0;
    for (std::string line; std::getline(std::cin, line);) {
      ++line_number;
      std::istringstream in(line);
      std::vector<int64_t> ids;
      for (std::string word; in >> word;) {
        size_t used = 0;
        int64_t id = 0;
        try {
          id = std::stoll(word, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        TESSEL_CHECK(used == word.size())
            << "tessel-dataset write: line " << line_number << ": '" << word << "' is not a token id";
        ids.push_back(id);
      }
      writer.AddDocument(ids);
    }
    writer.Finish();
    return 0;
  }
  return Usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "tessel-dataset: %s\n", e.what());
    return 1;
  }
}
