// TensorBoard event files: scalars a training run logs (loss, learning
// rate, throughput, evaluation), written where `tensorboard --logdir` finds
// them. A file is a sequence of TFRecords, each
//   length u64 | masked CRC32C(length) u32 | Event bytes | masked CRC32C(bytes) u32
// (little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), whose
// first Event names the file version "brain.Event:2".
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "zoo/crc32c.h"

namespace tessel::zoo {

// The masked CRC-32C TFRecords store.
uint32_t MaskedCrc32c(std::string_view bytes);
// One TFRecord framing `payload`.
std::string TFRecord(std::string_view payload);

class EventWriter {
 public:
  // Creates `directory` if needed and opens
  // events.out.tfevents.<unix seconds>.<host>.<pid> in it; throws naming the
  // path if it cannot be written.
  explicit EventWriter(const std::filesystem::path& directory);
  // One Summary event holding the scalar `tag` at `step`.
  void AddScalar(const std::string& tag, int64_t step, double value);
  // Pushes what was written to the file (TensorBoard reads files that grow).
  void Flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void Write(const std::string& event_bytes);

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
};

}  // namespace tessel::zoo
