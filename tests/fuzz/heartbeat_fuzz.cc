// Heartbeat lines the launcher reads from its ranks, reached as it reaches
// them: bytes arriving in pieces through HeartbeatStream (split where the
// input's first byte says), every parse described as the launcher's
// diagnosis does. Malformed lines are rejected; accepted ones survive a
// format/parse round trip.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/comm/heartbeat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0) {
    const size_t cut = data[0] % size;
    std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
    tessel::comm::HeartbeatStream stream;
    auto on_line = [](std::optional<tessel::comm::Heartbeat> hb) {
      if (hb) tessel::comm::DescribeHeartbeat(*hb);
    };
    stream.Append(bytes.substr(0, std::min(cut, bytes.size())), on_line);
    stream.Append(bytes.substr(std::min(cut, bytes.size())), on_line);
  }
  std::string_view line(reinterpret_cast<const char*>(data), size);
  auto hb = tessel::comm::ParseHeartbeat(line);
  if (!hb) return 0;
  if (hb->group.size() > tessel::comm::kMaxHeartbeatGroup) __builtin_trap();
  std::string again = tessel::comm::FormatHeartbeat(*hb);
  again.pop_back();  // the newline
  auto hb2 = tessel::comm::ParseHeartbeat(again);
  if (!hb2 || hb2->rank != hb->rank || hb2->op != hb->op || hb2->seq != hb->seq || hb2->in_op != hb->in_op)
    __builtin_trap();
  tessel::comm::DescribeHeartbeat(*hb);
  return 0;
}
