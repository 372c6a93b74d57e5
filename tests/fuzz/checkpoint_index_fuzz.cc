// A checkpoint's index.json: any bytes must parse into a checked index or
// throw tessel::Error, never crash, overflow or allocate by its counts. A
// parsed index prints and parses back to the same boxes, and the chunk
// holding a box's first element is found without listing its grid.
#include <cstdint>
#include <string_view>

#include "checkpoint/checkpoint.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tessel::checkpoint::CheckpointIndex index = tessel::checkpoint::ParseIndex(text, "fuzz/index.json");
    const tessel::checkpoint::CheckpointIndex again =
        tessel::checkpoint::ParseIndex(tessel::checkpoint::IndexText(index), "again");
    if (again.tensors.size() != index.tensors.size() || again.files != index.files) __builtin_trap();
    for (const auto& [name, t] : index.tensors) {
      const auto& other = again.tensors.at(name);
      if (other.shape != t.shape || other.boxes.size() != t.boxes.size()) __builtin_trap();
      for (size_t i = 0; i < t.boxes.size(); ++i)
        if (!(other.boxes[i].box == t.boxes[i].box) || other.boxes[i].file != t.boxes[i].file)
          __builtin_trap();
      // What a reader of the first element would read: one chunk, found by
      // arithmetic (never by listing a grid the index may make enormous).
      for (const auto& saved : t.boxes) {
        if (saved.box.empty()) continue;
        std::vector<tessel::Range> corner;
        for (int64_t d = 0; d < saved.box.ndim(); ++d)
          corner.push_back({saved.box[d].begin, saved.box[d].begin + 1});
        const auto chunks = tessel::checkpoint::ChunksOverlapping(name, saved, tessel::Box(corner));
        if (chunks.size() != 1 || chunks[0].box.Intersect(tessel::Box(corner)).numel() != 1) __builtin_trap();
      }
    }
  } catch (const tessel::Error&) {
  }
  return 0;
}
