// Conversions between the SBP/placement types and their protobuf messages.
#pragma once

#include "sbp/placement.h"
#include "sbp/sbp.h"
#include "sbp/sbp.pb.h"

namespace tessel {

proto::SbpProto ToProto(const Sbp& sbp);
proto::NdSbpProto ToProto(const NdSbp& nd_sbp);
proto::PlacementProto ToProto(const Placement& placement);
// These validate like the constructors and throw naming what is wrong.
Sbp SbpFromProto(const proto::SbpProto& msg);
NdSbp NdSbpFromProto(const proto::NdSbpProto& msg);
Placement PlacementFromProto(const proto::PlacementProto& msg);

}  // namespace tessel
