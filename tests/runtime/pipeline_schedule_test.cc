// Pipeline schedules (runtime/pipeline_schedule.h): the GPipe and 1F1B
// orders of 4 stages over 8 micro-batches written out by hand from their
// definitions, the activations each stage holds at once (1F1B: p - s;
// GPipe: m), the validator's verdicts and the errors.
#include "runtime/pipeline_schedule.h"

#include <gtest/gtest.h>

#include "tests/testing/test_util.h"

namespace tessel::runtime {
namespace {

using testing::ErrorOf;

std::string Order(Schedule schedule, int stages, int stage, int micro_batches) {
  return ActionsText(StageActions(schedule, stages, stage, micro_batches));
}

TEST(PipelineSchedule, GPipeRunsEveryForwardThenEveryBackward) {
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(Order(Schedule::kGPipe, 4, s, 8), "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7") << s;
}

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternatesThenCoolsDown) {
  // Stage s: p - s - 1 warm-up forwards, one forward one backward, the rest backwards.
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 0, 8), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 1, 8), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 2, 8), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 3, 8), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostStagesMinusStageMicroBatches) {
  for (int m : {1, 3, 4, 5, 8, 16}) {
    for (int s = 0; s < 4; ++s) {
      const std::vector<Action> one_f_one_b = StageActions(Schedule::kOneFOneB, 4, s, m);
      const std::vector<Action> gpipe = StageActions(Schedule::kGPipe, 4, s, m);
      EXPECT_EQ(ValidateActions(one_f_one_b, m), "") << "m " << m << " stage " << s;
      EXPECT_EQ(ValidateActions(gpipe, m), "") << "m " << m << " stage " << s;
      EXPECT_EQ(MaxInFlight(one_f_one_b), std::min(4 - s, m)) << "m " << m << " stage " << s;
      EXPECT_EQ(MaxInFlight(gpipe), m) << "m " << m << " stage " << s;
    }
  }
}

TEST(PipelineSchedule, WithFewerMicroBatchesThanStagesEarlyStagesRunGPipesOrder) {
  // 3 micro-batches on 4 stages: stages 0 and 1 warm up through all of them.
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 0, 3), Order(Schedule::kGPipe, 4, 0, 3));
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 1, 3), Order(Schedule::kGPipe, 4, 1, 3));
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 2, 3), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 3, 3), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(Order(Schedule::kOneFOneB, 4, 3, 1), "F0 B0");
}

TEST(PipelineSchedule, TheValidatorNamesWhatIsWrong) {
  auto trace = [](std::vector<std::pair<char, int>> steps) {
    std::vector<Action> out;
    for (auto [kind, k] : steps) out.push_back({kind == 'B', k});
    return out;
  };
  EXPECT_EQ(ValidateActions(trace({{'F', 0}, {'B', 0}, {'B', 1}, {'F', 1}}), 2), "B1 before F1");
  EXPECT_EQ(ValidateActions(trace({{'F', 0}, {'F', 0}, {'B', 0}}), 1), "F0 twice");
  EXPECT_EQ(ValidateActions(trace({{'F', 0}, {'F', 1}, {'B', 0}}), 2), "no B1");
  EXPECT_EQ(ValidateActions(trace({{'F', 0}, {'B', 0}}), 2), "no F1");
  EXPECT_EQ(ValidateActions(trace({{'F', 2}}), 2), "F2 is beyond the 2 micro-batches");
  EXPECT_EQ(MaxInFlight(trace({{'F', 0}, {'F', 1}, {'B', 0}, {'F', 2}, {'B', 1}, {'B', 2}})), 2);
}

TEST(PipelineSchedule, NamesAndBadArguments) {
  EXPECT_EQ(ParseSchedule("1f1b"), Schedule::kOneFOneB);
  EXPECT_EQ(ParseSchedule("gpipe"), Schedule::kGPipe);
  EXPECT_EQ(ParseSchedule("naive"), Schedule::kGPipe);
  EXPECT_STREQ(ScheduleName(Schedule::kOneFOneB), "1f1b");
  EXPECT_NE(ErrorOf([] { ParseSchedule("interleaved"); }).find("'interleaved' is unknown; expected gpipe"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { StageActions(Schedule::kGPipe, 4, 4, 8); }).find("stage 4 of 4"), std::string::npos);
  EXPECT_NE(ErrorOf([] { StageActions(Schedule::kGPipe, 4, 0, 0); }).find("over 0 micro-batches"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel::runtime
