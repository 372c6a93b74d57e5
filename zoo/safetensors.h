// safetensors files (Hugging Face's tensor format): an 8-byte little-endian
// header size N, N bytes of JSON naming each tensor's dtype, shape and byte
// range [begin, end) in the data that follows, then the data, row-major,
// little-endian. The header may hold "__metadata__", a map of strings.
// Readers elsewhere (the `safetensors` package, transformers) load what this
// writes.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tessel::zoo {

// The safetensors name of a dtype: "F32", "F16", "BF16", "I32", "I64", "BOOL".
std::string SafetensorsDType(DType dtype);

// Writes local (host) tensors under their names, in the order given (the
// header lists them sorted, as the format's own writer does; the data keeps
// this order). The header is padded with spaces to a multiple of 8 bytes so
// the data is aligned. Throws naming the tensor for a global, lazy or
// undefined tensor, or a repeated name, and naming the path if it cannot be
// written.
void WriteSafetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tessel::zoo
