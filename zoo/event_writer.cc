#include "zoo/event_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "zoo/tensorboard_event.pb.h"

namespace tessel::zoo {

namespace {

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t MaskedCrc32c(std::string_view bytes) {
  const uint32_t crc = Crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TFRecord(std::string_view payload) {
  std::string record;
  record.reserve(payload.size() + 16);
  AppendLittleEndian(record, payload.size(), 8);
  AppendLittleEndian(record, MaskedCrc32c(record), 4);
  record.append(payload);
  AppendLittleEndian(record, MaskedCrc32c(payload), 4);
  return record;
}

EventWriter::EventWriter(const std::filesystem::path& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  TESSEL_CHECK(!error) << "EventWriter: cannot create " << directory.string() << ": " << error.message();
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  path_ = directory / (std::string("events.out.tfevents.")
                           .append(std::to_string(static_cast<int64_t>(UnixSeconds())))
                           .append(".")
                           .append(host)
                           .append(".")
                           .append(std::to_string(getpid())));
  file_.reset(std::fopen(path_.c_str(), "wb"));
  TESSEL_CHECK(file_ != nullptr) << "EventWriter: cannot write " << path_.string() << ": "
                                 << std::strerror(errno);
  tensorboard::Event version;
  version.set_wall_time(UnixSeconds());
  version.set_file_version("brain.Event:2");
  Write(version.SerializeAsString());
  Flush();
}

void EventWriter::AddScalar(const std::string& tag, int64_t step, double value) {
  tensorboard::Event event;
  event.set_wall_time(UnixSeconds());
  event.set_step(step);
  tensorboard::SummaryValue* scalar = event.mutable_summary()->add_value();
  scalar->set_tag(tag);
  scalar->set_simple_value(static_cast<float>(value));
  Write(event.SerializeAsString());
}

void EventWriter::Write(const std::string& event_bytes) {
  const std::string record = TFRecord(event_bytes);
  TESSEL_CHECK(std::fwrite(record.data(), 1, record.size(), file_.get()) == record.size())
      << "EventWriter: writing " << path_.string() << " failed: " << std::strerror(errno);
}

void EventWriter::Flush() {
  TESSEL_CHECK(std::fflush(file_.get()) == 0)
      << "EventWriter: flushing " << path_.string() << " failed: " << std::strerror(errno);
}

}  // namespace tessel::zoo
