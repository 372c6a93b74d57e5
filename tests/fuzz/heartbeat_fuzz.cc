// Heartbeat lines the launcher reads from its ranks: malformed lines are
// rejected; accepted ones survive a format/parse round trip.
#include <cstdint>
#include <string_view>

#include "core/comm/heartbeat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
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
