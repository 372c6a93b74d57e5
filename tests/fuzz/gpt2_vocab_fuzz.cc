// A GPT-2 tokenizer's vocab.json (tessel-checkpoint export-hf --tokenizer,
// tessel-generate --tokenizer): any bytes give the end-of-text id, in
// range, and a vocabulary whose every token decodes, or throw
// tessel::Error; never crash.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/hugging_face_tokenizer.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  constexpr int64_t kVocabulary = 50257;  // GPT-2's
  try {
    const int64_t id = tessel::checkpoint::EndOfTextId(text, kVocabulary, "fuzz/vocab.json");
    if (id < 0 || id >= kVocabulary) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  try {
    const std::vector<std::string> tokens =
        tessel::checkpoint::Gpt2Vocabulary(text, kVocabulary, "fuzz/vocab.json");
    if (tokens.size() != static_cast<size_t>(kVocabulary)) __builtin_trap();
    std::vector<int64_t> ids(tokens.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
    const std::string decoded = tessel::checkpoint::DecodeGpt2(tokens, ids);
    size_t most = 0;
    for (const std::string& token : tokens) most += token.size();
    if (decoded.size() > 3 * most) __builtin_trap();  // a byte per code point, at most U+FFFD's 3 each
  } catch (const tessel::Error&) {
  }
  return 0;
}
