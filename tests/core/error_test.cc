#include "core/error.h"

#include <gtest/gtest.h>

namespace tessel {
namespace {

TEST(Error, CheckThrowsWithStreamedMessageAndCode) {
  int rank = 5;
  try {
    TESSEL_CHECK(rank < 4) << "RANK=" << rank << " but WORLD_SIZE=4";
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("RANK=5 but WORLD_SIZE=4"), std::string::npos);
    EXPECT_FALSE(e.status().ok());
  }
  EXPECT_NO_THROW({ TESSEL_CHECK(rank == 5) << "unused"; });
}

TEST(Error, StatusToStringAndThrow) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status bad(StatusCode::kTimeout, "barrier");
  EXPECT_EQ(bad.ToString(), "TIMEOUT: barrier");
  EXPECT_NO_THROW(ThrowIfError(ok));
  EXPECT_THROW(ThrowIfError(bad), Error);
}

}  // namespace
}  // namespace tessel
