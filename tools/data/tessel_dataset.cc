// tessel-dataset: looks into and writes Megatron-format indexed datasets
// (<prefix>.bin / <prefix>.idx, zoo/indexed_dataset.h).
//
//   tessel-dataset info PREFIX            counts, dtype, largest token id
//   tessel-dataset dump PREFIX            one line per sequence: its token ids
//   tessel-dataset write PREFIX DTYPE     one document per stdin line of ids
//                                         (DTYPE: uint8 int8 int16 uint16 int32 int64)
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "zoo/indexed_dataset.h"

using namespace tessel;

namespace {

const std::map<std::string, zoo::TokenDType> kDTypes = {
    {"uint8", zoo::TokenDType::kUInt8}, {"int8", zoo::TokenDType::kInt8},
    {"int16", zoo::TokenDType::kInt16}, {"uint16", zoo::TokenDType::kUInt16},
    {"int32", zoo::TokenDType::kInt32}, {"int64", zoo::TokenDType::kInt64}};

int Usage() {
  std::fprintf(
      stderr,
      "usage: tessel-dataset info PREFIX | dump PREFIX | write PREFIX DTYPE < ids\n"
      "  info   counts, dtype and the largest token id of <PREFIX>.bin/.idx\n"
      "  dump   one line per sequence: its token ids, space-separated\n"
      "  write  one document per stdin line of token ids; DTYPE is uint8, int8, int16, uint16, int32 "
      "or int64\n");
  return 2;
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
