// The .idx of a Megatron-format indexed dataset: any bytes must parse or
// throw tessel::Error, never read past the buffer or allocate by the
// header's counts. The first 8 bytes give the .bin size to check against;
// a parsed index's entries are all readable.
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "zoo/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t bin_bytes = 0;
  std::memcpy(&bin_bytes, data, 8);
  try {
    tessel::zoo::IndexedDatasetIndex index = tessel::zoo::ParseIndex(data + 8, size - 8, bin_bytes, "fuzz.idx");
    // Every entry is read and was checked non-negative. (Each on its own: a
    // sum of offsets near the .bin size can overflow.)
    for (size_t i = 0; i < index.num_sequences; ++i)
      if (index.length(i) < 0 || index.offset(i) < 0) __builtin_trap();
    for (size_t k = 0; k < index.num_document_indices; ++k)
      if (index.document_index(k) < 0) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
