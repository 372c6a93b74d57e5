#include "sbp/sbp.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "sbp/sbp_proto.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::ErrorOf;

TEST(Sbp, ParseAndPrint) {
  EXPECT_EQ(Sbp::Parse("S(2)"), S(2));
  EXPECT_EQ(Sbp::Parse(" B "), B());
  EXPECT_EQ(Sbp::Parse("P"), P());
  EXPECT_EQ(Sbp::Parse("P(max)"), PMax());
  EXPECT_EQ(S(1).ToString(), "S(1)");
  EXPECT_EQ(PMax().ToString(), "P(max)");
  NdSbp nd = NdSbp::Parse("[S(0), B]");
  EXPECT_EQ(nd, (NdSbp{S(0), B()}));
  EXPECT_EQ(nd.ToString(), "[S(0), B]");
  EXPECT_EQ(NdSbp::Parse("[P,S(10),B]"), (NdSbp{P(), S(10), B()}));
  EXPECT_EQ(NdSbp::Parse("S(0)"), NdSbp{S(0)});
  EXPECT_NE(ErrorOf([] { Sbp::Parse("S(x)"); }).find("cannot parse SBP 'S(x)'"), std::string::npos);
  EXPECT_NE(ErrorOf([] { NdSbp::Parse("[S(0),,B]"); }).find("empty entry"), std::string::npos);
  EXPECT_THROW(S(-1), Error);
}

TEST(Sbp, CheckNamesTheProblem) {
  EXPECT_NE(ErrorOf([] {
              NdSbp{S(3)}.Check(3, 1);
            }).find("NdSbp [S(3)] splits axis 3 but the tensor has 3 dimension(s)"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              (NdSbp{S(0), B()}).Check(2, 1);
            }).find("NdSbp [S(0), B] has 2 entries but the placement's hierarchy has 1 axes"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              (NdSbp{P(), PMax()}).Check(2, 2);
            }).find("mixes partial sum and partial max"),
            std::string::npos);
  EXPECT_NO_THROW((NdSbp{S(1), P()}).Check(2, 2));
}

TEST(Sbp, ProtoRoundTrip) {
  for (const NdSbp& nd : {NdSbp{S(0), B()}, NdSbp{P(), PMax(), S(7)}}) {
    proto::NdSbpProto msg = ToProto(nd);
    std::string bytes = msg.SerializeAsString();
    proto::NdSbpProto back;
    ASSERT_TRUE(back.ParseFromString(bytes));
    EXPECT_EQ(NdSbpFromProto(back), nd);
  }
  EXPECT_THROW(SbpFromProto(proto::SbpProto{}), Error);
}

}  // namespace
}  // namespace tessel
