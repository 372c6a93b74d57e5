// A GPT-2 tokenizer's vocab.json (tessel-checkpoint export-hf --tokenizer):
// any bytes give the end-of-text id, in range, or throw tessel::Error;
// never crash.
#include <cstdint>
#include <string>

#include "checkpoint/hugging_face_tokenizer.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const int64_t id = tessel::checkpoint::EndOfTextId(text, 50257, "fuzz/vocab.json");
    if (id < 0 || id >= 50257) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
