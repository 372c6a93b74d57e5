#include "sbp/sbp_proto.h"

#include "core/error.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

proto::SbpProto ToProto(const Sbp& sbp) {
  proto::SbpProto msg;
  switch (sbp.type()) {
    case SbpType::kSplit:
      msg.mutable_split()->set_axis(sbp.axis());
      break;
    case SbpType::kBroadcast:
      msg.mutable_broadcast();
      break;
    case SbpType::kPartialSum:
      msg.mutable_partial_sum();
      break;
    case SbpType::kPartialMax:
      msg.mutable_partial_max();
      break;
  }
  return msg;
}

proto::NdSbpProto ToProto(const NdSbp& nd_sbp) {
  proto::NdSbpProto msg;
  for (const Sbp& s : nd_sbp.sbps()) *msg.add_sbp() = ToProto(s);
  return msg;
}

proto::PlacementProto ToProto(const Placement& placement) {
  proto::PlacementProto msg;
  msg.set_device_type(std::string(DeviceTypeName(placement.device_type())));
  for (int r : placement.ranks()) msg.add_ranks(r);
  for (int64_t h : placement.hierarchy()) msg.add_hierarchy(h);
  return msg;
}

Sbp SbpFromProto(const proto::SbpProto& msg) {
  switch (msg.kind_case()) {
    case proto::SbpProto::kSplit:
      return S(msg.split().axis());
    case proto::SbpProto::kBroadcast:
      return B();
    case proto::SbpProto::kPartialSum:
      return P();
    case proto::SbpProto::kPartialMax:
      return PMax();
    case proto::SbpProto::KIND_NOT_SET:
      break;
  }
  TESSEL_THROW(StatusCode::kInvalidArgument) << "SbpProto has no kind set; expected split, broadcast, "
                                                "partial_sum or partial_max";
}

NdSbp NdSbpFromProto(const proto::NdSbpProto& msg) {
  std::vector<Sbp> sbps;
  for (const auto& s : msg.sbp()) sbps.push_back(SbpFromProto(s));
  return NdSbp(std::move(sbps));
}

Placement PlacementFromProto(const proto::PlacementProto& msg) {
  return Placement(ParseDeviceType(msg.device_type()),
                   std::vector<int>(msg.ranks().begin(), msg.ranks().end()),
                   std::vector<int64_t>(msg.hierarchy().begin(), msg.hierarchy().end()));
}

}  // namespace tessel
