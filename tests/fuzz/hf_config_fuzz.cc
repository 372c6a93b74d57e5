// A Hugging Face config.json: any bytes must become tessel model fields
// (which then give config.json text that reads back to the same fields) or
// throw tessel::Error; never crash.
#include <cstdint>
#include <string>

#include "checkpoint/hugging_face.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const tessel::config::ModelConfig model =
        tessel::checkpoint::ModelFromHuggingFaceConfig(text, "fuzz/config.json");
    const tessel::config::ModelConfig again = tessel::checkpoint::ModelFromHuggingFaceConfig(
        tessel::checkpoint::HuggingFaceConfigJson(model), "again");
    if (again.SerializeAsString() != model.SerializeAsString()) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
