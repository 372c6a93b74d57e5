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
    int64_t sum = 0;
    for (size_t i = 0; i < index.num_sequences; ++i) sum += index.length(i) + index.offset(i);
    for (size_t k = 0; k < index.num_document_indices; ++k) sum += index.document_index(k);
    if (sum < 0) __builtin_trap();  // lengths, offsets and indices were checked non-negative
  } catch (const tessel::Error&) {
  }
  return 0;
}
