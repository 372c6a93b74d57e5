// TensorBoard event files: CRC-32C against published check values, the
// TFRecord framing, and a written file decoded record by record.
#include "zoo/event_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "zoo/tensorboard_event.pb.h"

namespace tessel::zoo {
namespace {

uint64_t ReadLittleEndian(const std::string& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = 0; i < width; ++i) value |= uint64_t(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  return value;
}

TEST(Crc32c, MatchesPublishedCheckValues) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);              // the CRC catalogue's check value
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);    // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // RFC 3720 B.4: 32 bytes of ones
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32c, MaskRotatesAndAddsTheConstant) {
  const uint32_t crc = Crc32c("123456789");
  EXPECT_EQ(MaskedCrc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TFRecord, FramesLengthPayloadAndChecksums) {
  const std::string payload = "hello, tensorboard";
  const std::string record = TFRecord(payload);
  ASSERT_EQ(record.size(), 8 + 4 + payload.size() + 4);
  EXPECT_EQ(ReadLittleEndian(record, 0, 8), payload.size());
  EXPECT_EQ(ReadLittleEndian(record, 8, 4), MaskedCrc32c(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, payload.size()), payload);
  EXPECT_EQ(ReadLittleEndian(record, 12 + payload.size(), 4), MaskedCrc32c(payload));
}

TEST(EventWriter, WritesTheVersionThenOneEventPerScalar) {
  const auto dir = std::filesystem::path(testing::TempDir()) / "event_writer_test";
  std::filesystem::remove_all(dir);
  std::filesystem::path path;
  {
    EventWriter writer(dir);
    path = writer.path();
    writer.AddScalar("train/loss", 1, 7.5);
    writer.AddScalar("eval/perplexity", 20, 1234.25);
  }
  EXPECT_EQ(path.parent_path(), dir);
  EXPECT_EQ(path.filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();

  std::vector<tensorboard::Event> events;
  for (size_t at = 0; at < bytes.size();) {
    ASSERT_LE(at + 12, bytes.size());
    const uint64_t length = ReadLittleEndian(bytes, at, 8);
    ASSERT_EQ(ReadLittleEndian(bytes, at + 8, 4), MaskedCrc32c(bytes.substr(at, 8)));
    ASSERT_LE(at + 12 + length + 4, bytes.size());
    const std::string payload = bytes.substr(at + 12, length);
    ASSERT_EQ(ReadLittleEndian(bytes, at + 12 + length, 4), MaskedCrc32c(payload));
    ASSERT_TRUE(events.emplace_back().ParseFromString(payload));
    at += 12 + length + 4;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.6e9);
  EXPECT_EQ(events[1].step(), 1);
  ASSERT_EQ(events[1].summary().value_size(), 1);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 7.5f);
  EXPECT_EQ(events[2].step(), 20);
  EXPECT_EQ(events[2].summary().value(0).tag(), "eval/perplexity");
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 1234.25f);
}

TEST(EventWriter, NamesADirectoryItCannotCreate) {
  try {
    EventWriter writer("/proc/tessel-cannot-create-this");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/tessel-cannot-create-this"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::zoo
