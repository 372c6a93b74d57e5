// Serialized Sbp/NdSbp/Placement protobuf messages (plans and checkpoints
// carry them): any bytes either fail to parse or convert, or throw
// tessel::Error naming the bad field.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "sbp/sbp_proto.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 65536) return 0;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    tessel::proto::NdSbpProto nd;
    if (nd.ParseFromString(bytes)) tessel::NdSbpFromProto(nd);
  } catch (const tessel::Error&) {
  }
  try {
    tessel::proto::PlacementProto placement;
    if (placement.ParseFromString(bytes)) tessel::PlacementFromProto(placement);
  } catch (const tessel::Error&) {
  }
  return 0;
}
