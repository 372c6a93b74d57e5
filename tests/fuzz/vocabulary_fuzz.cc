// A tokenizer's vocabulary file (data.vocab_file: vocab.json, tokenizer.json
// or vocab.txt): any bytes give tokens by id, as many as the format allows, or
// throw tessel::Error; never crash, never allocate beyond the bound.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "zoo/vocabulary.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const std::vector<std::string> tokens = tessel::zoo::ParseVocabJson(text, "fuzz/vocab.json");
    if (tokens.size() > 2 * size + 1024)
      __builtin_trap();  // ids bounded by the entries, entries by the bytes
  } catch (const tessel::Error&) {
  }
  try {
    const std::vector<std::string> tokens = tessel::zoo::ParseTokenizerJson(text, "fuzz/tokenizer.json");
    if (tokens.empty() || tokens.size() > 2 * size + 1024) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  try {
    const std::vector<std::string> tokens = tessel::zoo::ParseVocabTxt(text, "fuzz/vocab.txt");
    if (tokens.empty() || tokens.size() > size + 1) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
