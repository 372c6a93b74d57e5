// Pipeline schedules (runtime/pipeline_schedule.h): the GPipe and 1F1B
// orders of 4 stages over 8 micro-batches written out by hand from their
// definitions, the activations each stage holds at once (1F1B: p - s;
// GPipe: m), the validator's verdicts, schedules a program registers (and
// the deadlock check that plays all stages together), the errors, and
// ZB-H1's split backwards: valid, within 1F1B's memory, and with unit costs
// as short as its published bubble says.
#include "runtime/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/testing/test_util.h"

namespace tessel::runtime {
namespace {

using testing::ErrorOf;

std::vector<Action> OneFOneBOrder(int stages, int stage, int micro_batches) {
  return StageActions("1f1b", stages, stage, micro_batches);
}

std::string Order(const std::string& schedule, int stages, int stage, int micro_batches) {
  return ActionsText(StageActions(schedule, stages, stage, micro_batches));
}

TEST(PipelineSchedule, GPipeRunsEveryForwardThenEveryBackward) {
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(Order("gpipe", 4, s, 8), "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7") << s;
}

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternatesThenCoolsDown) {
  // Stage s: p - s - 1 warm-up forwards, one forward one backward, the rest backwards.
  EXPECT_EQ(Order("1f1b", 4, 0, 8), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(Order("1f1b", 4, 1, 8), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(Order("1f1b", 4, 2, 8), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(Order("1f1b", 4, 3, 8), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostStagesMinusStageMicroBatches) {
  for (int m : {1, 3, 4, 5, 8, 16}) {
    for (int s = 0; s < 4; ++s) {
      const std::vector<Action> one_f_one_b = StageActions("1f1b", 4, s, m);
      const std::vector<Action> gpipe = StageActions("gpipe", 4, s, m);
      EXPECT_EQ(ValidateActions(one_f_one_b, m), "") << "m " << m << " stage " << s;
      EXPECT_EQ(ValidateActions(gpipe, m), "") << "m " << m << " stage " << s;
      EXPECT_EQ(MaxInFlight(one_f_one_b), std::min(4 - s, m)) << "m " << m << " stage " << s;
      EXPECT_EQ(MaxInFlight(gpipe), m) << "m " << m << " stage " << s;
    }
  }
}

TEST(PipelineSchedule, WithFewerMicroBatchesThanStagesEarlyStagesRunGPipesOrder) {
  // 3 micro-batches on 4 stages: stages 0 and 1 warm up through all of them.
  EXPECT_EQ(Order("1f1b", 4, 0, 3), Order("gpipe", 4, 0, 3));
  EXPECT_EQ(Order("1f1b", 4, 1, 3), Order("gpipe", 4, 1, 3));
  EXPECT_EQ(Order("1f1b", 4, 2, 3), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(Order("1f1b", 4, 3, 3), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(Order("1f1b", 4, 3, 1), "F0 B0");
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

// The step time, in units, of all stages' orders over `v` chunks per stage
// when every (chunk's) F, B and W takes one unit (a B without W units:
// two) and a stage runs its order as soon as each unit's input arrived:
// virtual stage j = chunk * p + stage; its forward after j - 1's, its
// backward after j + 1's (the last one's after its own forward).
int UnitTimeSpan(const std::string& schedule, int p, int m, int v = 1) {
  std::vector<std::vector<Action>> orders;
  bool split = false;
  for (int s = 0; s < p; ++s) {
    orders.push_back(StageActions(schedule, p, s, m, v));
    for (const Action& a : orders.back()) split |= a.weight;
  }
  const int virtual_stages = p * v;
  std::vector<std::vector<int>> forward_end(virtual_stages, std::vector<int>(m, -1)),
      backward_end = forward_end;
  std::vector<size_t> next(p, 0);
  std::vector<int> free_at(p, 0);
  int span = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < orders[s].size()) {
        const Action& a = orders[s][next[s]];
        const int j = a.chunk * p + s;
        int start = free_at[s];
        if (!a.weight) {
          const int after = a.backward ? (j + 1 < virtual_stages ? backward_end[j + 1][a.micro_batch]
                                                                 : forward_end[j][a.micro_batch])
                                       : (j > 0 ? forward_end[j - 1][a.micro_batch] : 0);
          if (after < 0) break;
          start = std::max(start, after);
        }
        const int end = start + (a.backward && !a.weight && !split ? 2 : 1);
        if (!a.weight) (a.backward ? backward_end : forward_end)[j][a.micro_batch] = end;
        free_at[s] = end;
        span = std::max(span, end);
        ++next[s];
        moved = true;
      }
    }
  }
  return span;
}

TEST(PipelineSchedule, ZeroBubbleH1SplitsBackwardsAndFillsTheBubbleWithWeightGradients) {
  EXPECT_EQ(Order("zb_h1", 4, 0, 8),
            "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  EXPECT_EQ(Order("zb_h1", 4, 3, 8),
            "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
  for (int p : {1, 2, 3, 4, 6}) {
    for (int m : {1, 2, 3, 4, 5, 8, 12}) {
      SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m));
      EXPECT_EQ(CheckSchedule("zb_h1", p, m), "");
      for (int s = 0; s < p; ++s) {
        const std::vector<Action> order = StageActions("zb_h1", p, s, m);
        EXPECT_EQ(order.size(), static_cast<size_t>(3 * m));
        // 1F1B's p - s micro-batches, and s more whose W waits.
        EXPECT_LE(MaxInFlight(order), std::min(p, m)) << "stage " << s;
      }
      // With unit costs the step takes 3m + p - 1 units (bubble (p - 1) /
      // (3m + p - 1)) once every stage has p micro-batches to work on;
      // 1F1B's takes 3(m + p - 1).
      EXPECT_EQ(UnitTimeSpan("1f1b", p, m), 3 * (m + p - 1));
      if (m >= p) EXPECT_EQ(UnitTimeSpan("zb_h1", p, m), 3 * m + p - 1);
      EXPECT_LE(UnitTimeSpan("zb_h1", p, m), UnitTimeSpan("1f1b", p, m));
    }
  }
}

TEST(PipelineSchedule, WeightGradientUnitsAreValidated) {
  auto trace = [](std::vector<std::pair<char, int>> steps) {
    std::vector<Action> out;
    for (auto [kind, k] : steps) out.push_back({kind != 'F', k, kind == 'W'});
    return out;
  };
  EXPECT_EQ(ValidateActions(trace({{'F', 0}, {'W', 0}, {'B', 0}}), 1), "W0 before B0");
  EXPECT_EQ(ValidateActions(trace({{'F', 0}, {'B', 0}, {'W', 0}, {'W', 0}}), 1), "W0 twice");
  EXPECT_EQ(ValidateActions(trace({{'F', 0}, {'F', 1}, {'B', 0}, {'W', 0}, {'B', 1}}), 2),
            "no W1 (other micro-batches have W units)");
  EXPECT_EQ(ValidateActions({{false, 0, true}}, 1), "W0 is a weight-gradient unit that is not a backward");
  EXPECT_EQ(ActionsText(trace({{'F', 0}, {'B', 0}, {'W', 0}})), "F0 B0 W0");
  // Activations are held until the W reads them.
  EXPECT_EQ(MaxInFlight(trace({{'F', 0}, {'B', 0}, {'F', 1}, {'W', 0}, {'B', 1}, {'W', 1}})), 2);
}

TEST(PipelineSchedule, NamesAndBadArguments) {
  EXPECT_EQ(ParseSchedule("1f1b"), "1f1b");
  EXPECT_EQ(ParseSchedule("gpipe"), "gpipe");
  EXPECT_EQ(ParseSchedule("naive"), "gpipe");
  const std::string unknown = ErrorOf([] { ParseSchedule("interleaved"); });
  EXPECT_NE(unknown.find(
                "'interleaved' is not registered; registered: 1f1b, gpipe, interleaved_1f1b, naive, zb_h1"),
            std::string::npos)
      << unknown;
  EXPECT_NE(ErrorOf([] { StageActions("gpipe", 4, 4, 8); }).find("stage 4 of 4"), std::string::npos);
  EXPECT_NE(ErrorOf([] { StageActions("gpipe", 4, 0, 0); }).find("over 0 micro-batches"), std::string::npos);
  EXPECT_NE(ErrorOf([] { RegisterSchedule("1f1b", OneFOneBOrder); }).find("'1f1b' is already registered"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { RegisterSchedule("my schedule", OneFOneBOrder); }).find("name 'my schedule'"),
            std::string::npos);
}

TEST(PipelineSchedule, InterleavedOneFOneBRunsChunksInRoundsOfStagesMicroBatches) {
  // 2 stages of 2 chunks over 4 micro-batches: forwards in rounds of 2
  // micro-batches, chunk 0 then chunk 1; backwards from chunk 1 down.
  EXPECT_EQ(ActionsText(StageActions("interleaved_1f1b", 2, 0, 4, 2)),
            "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0");
  EXPECT_EQ(ActionsText(StageActions("interleaved_1f1b", 2, 1, 4, 2)),
            "F0c0 F1c0 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 B2c0 B3c0");
  // One chunk is 1F1B.
  EXPECT_EQ(ActionsText(StageActions("interleaved_1f1b", 4, 1, 8, 1)), Order("1f1b", 4, 1, 8));
  for (int p : {2, 3, 4}) {
    for (int v : {1, 2, 3}) {
      for (int rounds : {1, 2, 3, 4}) {
        const int m = rounds * p;
        SCOPED_TRACE("p " + std::to_string(p) + " v " + std::to_string(v) + " m " + std::to_string(m));
        EXPECT_EQ(CheckSchedule("interleaved_1f1b", p, m, v), "");
        for (int s = 0; s < p; ++s) {
          const std::vector<Action> order = StageActions("interleaved_1f1b", p, s, m, v);
          EXPECT_EQ(order.size(), static_cast<size_t>(2 * m * v));
          // Warm-up forwards plus the one in flight in the steady state.
          if (v > 1 && m > p)
            EXPECT_EQ(MaxInFlight(order), std::min(m * v, 2 * (p - s - 1) + (v - 1) * p + 1));
        }
        // Chunk units (F 1, B 2): the ideal is 3 v m on every stage and the
        // bubble 3 (p - 1) — a stage's 3 (p - 1) v of 1F1B, cut v-fold —
        // once there are two rounds; with one (m = p) the stages run every
        // forward first.
        if (rounds >= 2) EXPECT_EQ(UnitTimeSpan("interleaved_1f1b", p, m, v), 3 * (v * m + p - 1));
        EXPECT_LE(UnitTimeSpan("interleaved_1f1b", p, m, v), 3 * v * (m + p - 1));
      }
    }
  }
}

TEST(PipelineSchedule, InterleavedOneFOneBNeedsAMultipleOfTheStagesAndChunkedSchedules) {
  const std::string not_multiple = ErrorOf([] { StageActions("interleaved_1f1b", 4, 0, 6, 2); });
  EXPECT_NE(
      not_multiple.find("interleaved 1F1B over 6 micro-batches on 4 stages: expected the micro-batches a "
                        "multiple of the stage count"),
      std::string::npos)
      << not_multiple;
  EXPECT_NE(not_multiple.find("use 4 or 8"), std::string::npos) << not_multiple;
  EXPECT_NE(ErrorOf([] { CheckSchedule("interleaved_1f1b", 4, 3, 2); }).find("use 4"), std::string::npos);
  // A schedule of one chunk per stage refuses two.
  const std::string one_chunk = ErrorOf([] { StageActions("1f1b", 2, 0, 4, 2); });
  EXPECT_NE(one_chunk.find("pipeline schedule '1f1b' runs one model chunk per stage, and each stage holds 2 "
                           "(virtual_pipeline_size 2); expected interleaved_1f1b"),
            std::string::npos)
      << one_chunk;
  // The validator names chunks.
  EXPECT_EQ(ValidateActions({{false, 0, false, 0}, {true, 0, false, 0}, {false, 0, false, 1}}, 1, 2),
            "no B0c1");
  EXPECT_EQ(ValidateActions({{false, 0, false, 1}, {true, 0, false, 0}}, 1, 2), "B0c0 before F0c0");
  EXPECT_EQ(ValidateActions({{false, 0, false, 2}}, 1, 2), "F0c2 is beyond the 2 chunk(s)");
  EXPECT_EQ(ActionsText({{false, 1, false, 0}, {true, 1, false, 1}}), "F1c0 B1c1");
  // Two chunks of one micro-batch each held at once count twice.
  EXPECT_EQ(
      MaxInFlight({{false, 0, false, 0}, {false, 0, false, 1}, {true, 0, false, 1}, {true, 0, false, 0}}), 2);
}

TEST(PipelineSchedule, AChunkedScheduleRegistersAndIsCheckedOverVirtualStages) {
  // GPipe over chunks: every chunk's forwards in chunk order, then the
  // backwards from the last chunk down.
  RegisterSchedule("test_chunked_gpipe", [](int, int, int m, int v) {
    std::vector<Action> out;
    for (int c = 0; c < v; ++c)
      for (int k = 0; k < m; ++k) out.push_back({false, k, false, c});
    for (int c = v - 1; c >= 0; --c)
      for (int k = 0; k < m; ++k) out.push_back({true, k, false, c});
    return out;
  });
  EXPECT_EQ(CheckSchedule("test_chunked_gpipe", 2, 3, 2), "");
  EXPECT_EQ(ActionsText(StageActions("test_chunked_gpipe", 2, 1, 2, 2)),
            "F0c0 F1c0 F0c1 F1c1 B0c1 B1c1 B0c0 B1c0");
  // Backwards from chunk 0 up: chunk 0's backward waits for chunk 1's on
  // the next stage, which waits for this stage's chunk 1 behind it.
  RegisterSchedule("test_chunked_wrong_way", [](int, int, int m, int v) {
    std::vector<Action> out;
    for (int c = 0; c < v; ++c)
      for (int k = 0; k < m; ++k) out.push_back({false, k, false, c});
    for (int c = 0; c < v; ++c)
      for (int k = 0; k < m; ++k) out.push_back({true, k, false, c});
    return out;
  });
  EXPECT_EQ(
      CheckSchedule("test_chunked_wrong_way", 2, 1, 2),
      "pipeline schedule 'test_chunked_wrong_way' deadlocks on 2 stages of 2 chunks over 1 micro-batches: "
      "stage 0 waits at B0c0 for stage 1's B0c0; stage 1 waits at B0c0 for stage 0's B0c1");
}

// Backwards last-in first-out: every forward, then the backwards from the
// newest micro-batch down. Valid on every stage, and the stages agree.
std::vector<Action> GPipeLifo(int, int, int micro_batches) {
  std::vector<Action> out;
  for (int k = 0; k < micro_batches; ++k) out.push_back({false, k});
  for (int k = micro_batches - 1; k >= 0; --k) out.push_back({true, k});
  return out;
}

TEST(PipelineSchedule, ARegisteredScheduleRunsByNameAndIsChecked) {
  RegisterSchedule("test_gpipe_lifo", GPipeLifo);
  const std::vector<std::string> names = ScheduleNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "test_gpipe_lifo"), names.end());
  EXPECT_EQ(ParseSchedule("test_gpipe_lifo"), "test_gpipe_lifo");
  EXPECT_EQ(Order("test_gpipe_lifo", 4, 2, 4), "F0 F1 F2 F3 B3 B2 B1 B0");
  EXPECT_EQ(CheckSchedule("test_gpipe_lifo", 4, 8), "");
  EXPECT_EQ(CheckSchedule("1f1b", 4, 8), "");
  EXPECT_EQ(CheckSchedule("gpipe", 3, 5), "");

  // A stage order that drops a backward is refused, naming the stage.
  RegisterSchedule("test_drops_b0", [](int stages, int stage, int m) {
    std::vector<Action> out = GPipeLifo(stages, stage, m);
    if (stage == 1) out.pop_back();
    return out;
  });
  const std::string dropped = ErrorOf([] { CheckSchedule("test_drops_b0", 2, 3); });
  EXPECT_NE(dropped.find(
                "'test_drops_b0' gives stage 1 of 2 over 3 micro-batches the order [F0 F1 F2 B2 B1]: no B0"),
            std::string::npos)
      << dropped;

  // Adjacent stages that pass micro-batches on in different orders.
  RegisterSchedule("test_swapped_forwards", [](int, int stage, int m) {
    std::vector<Action> out;
    for (int k = 0; k < m; ++k) out.push_back({false, stage == 1 && k < 2 ? 1 - k : k});
    for (int k = 0; k < m; ++k) out.push_back({true, k});
    return out;
  });
  EXPECT_EQ(
      CheckSchedule("test_swapped_forwards", 3, 3),
      "pipeline schedule 'test_swapped_forwards' runs the forwards of stage 0 in the order [0 1 2] and those "
      "of stage 1 in [1 0 2]; adjacent stages pass their micro-batches on in order, so they must agree");

  // The same orders of forwards and backwards everywhere, but stage 0 runs
  // micro-batch 0 through its backward before it sends micro-batch 1's
  // forward, which stage 1 wants before it sends back B0: they wait on
  // each other.
  RegisterSchedule("test_deadlock", [](int stages, int stage, int m) {
    if (stage == 1) return StageActions("gpipe", stages, stage, m);
    std::vector<Action> out;  // F0 B0 F1 B1 ...
    for (int k = 0; k < m; ++k) out.insert(out.end(), {{false, k}, {true, k}});
    return out;
  });
  EXPECT_EQ(
      CheckSchedule("test_deadlock", 2, 3),
      "pipeline schedule 'test_deadlock' deadlocks on 2 stages over 3 micro-batches: stage 0 waits at B0 "
      "for stage 1's B0; stage 1 waits at F1 for stage 0's F1");
  EXPECT_NE(ErrorOf([] { RegisterSchedule("in_order", GPipeLifo); }).find("'in_order' is reserved"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel::runtime
