// Pipeline schedules: the order in which one stage runs the forward (F) and
// backward (B) of each micro-batch. The actor runtime (runtime/actor_runtime.h)
// runs a rank's ops in this order; the same functions give the reference
// sequences tests compare a run's trace with.
//
// Schedules are registered by name; the config's train.graph.pipeline picks
// one. Built in:
// GPipe ("gpipe", also "naive"): every forward, then every backward. A stage
// holds the activations of all m micro-batches at once.
// 1F1B ("1f1b"): stage s of p runs min(p - s - 1, m) warm-up forwards, then
// alternates one forward and one backward, then the cool-down backwards.
// A stage holds at most min(p - s, m) micro-batches' activations.
// Zero bubble ("zb_h1", Qi et al.'s ZB-H1): each backward split into B
// (input gradients, what the previous stage waits for) and W (weight
// gradients); 1F1B's order of F and B, with stage s running W of
// micro-batch k after B of k + s, so the later stages fill 1F1B's
// cool-down waits with weight gradients. With F, B and W of one cost the
// bubble is (p - 1) / (3m + p - 1) of a step against 1F1B's
// (p - 1) / (m + p - 1); a stage holds at most p micro-batches (forward
// run, W not yet).
//
// Interleaved 1F1B ("interleaved_1f1b", Narayanan et al.'s virtual
// pipeline): each stage holds v model chunks (a model of p * v contiguous
// parts, part j on stage j mod p), so a micro-batch passes each stage v
// times. Stages run their chunks' forwards in rounds of p micro-batches
// (chunk 0's, then chunk 1's, ...) and their backwards the same way from
// the last chunk down, warming up with 2 (p - s - 1) + (v - 1) p forwards
// before alternating. The bubble shrinks v-fold, to (p - 1) / (v m) of the
// ideal step (a share (p - 1) / (v m + p - 1) of the step), for v times
// the stage transfers. The micro-batch count must be a multiple of p (an
// error says so); with v = 1 it is 1F1B.
//
// A program adds its own before it builds the runtime (docs/extending.md):
//
//   runtime::RegisterSchedule("gpipe_lifo", [](int stages, int stage, int m) {
//     std::vector<runtime::Action> out;
//     for (int k = 0; k < m; ++k) out.push_back({false, k});
//     for (int k = m - 1; k >= 0; --k) out.push_back({true, k});
//     return out;
//   });
//
// Before a schedule runs, CheckSchedule plays every stage's sequence
// together: a sequence that misses or repeats a unit, adjacent stages that
// pass micro-batches on in different orders, or stages whose orders wait on
// each other (a deadlock), is an error naming the schedule, the stage and
// the unit, not a hang or a mixed-up transfer. "in_order" is reserved (graph
// mode's reference executor).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tessel::runtime {

struct Action {
  bool backward = false;
  int micro_batch = 0;
  // A weight-gradient unit (W, with backward true): the part of the
  // micro-batch's backward that only feeds parameter gradients. A schedule
  // that lists W units splits every backward so: its B units then compute
  // only what flows to the previous stage (the input gradients), and each
  // W may come any time after its B (zero-bubble schedules fill the
  // pipeline's gaps with them). Without W units a B is the whole backward.
  bool weight = false;
  // The model chunk (virtual stage chunk * stages + stage) the unit runs,
  // under a schedule over several chunks per stage; 0 otherwise.
  int chunk = 0;
  bool operator==(const Action& o) const {
    return backward == o.backward && micro_batch == o.micro_batch && weight == o.weight && chunk == o.chunk;
  }
};

// The order of stage `stage` of `stages` over `micro_batches` micro-batches.
using ScheduleFunction = std::function<std::vector<Action>(int stages, int stage, int micro_batches)>;
// The same when each stage holds `chunks` model chunks: every chunk's F
// and B of every micro-batch (and W, when the schedule splits backwards).
using ChunkedScheduleFunction =
    std::function<std::vector<Action>(int stages, int stage, int micro_batches, int chunks)>;

// Adds a schedule under `name` (letters, digits, '_', '-', '.'). Throws if
// the name is taken or malformed. Thread-safe; call it before the runtime
// that uses it is built. A ScheduleFunction runs one chunk per stage.
void RegisterSchedule(const std::string& name, ScheduleFunction schedule);
void RegisterSchedule(const std::string& name, ChunkedScheduleFunction schedule);
// The registered names, sorted ("1f1b", "gpipe", "naive", and the program's).
std::vector<std::string> ScheduleNames();

// The registered schedule `name` stands for ("naive" is "gpipe"); anything
// else throws naming the value and the registered names.
std::string ParseSchedule(const std::string& name);

// The order of stage `stage` of `stages` under schedule `schedule`, each
// stage holding `chunks` model chunks, checked with ValidateActions.
// Throws on a stage out of range, counts below 1, an unknown schedule, a
// schedule of one chunk asked for several, or a sequence that does not
// hold.
std::vector<Action> StageActions(const std::string& schedule, int stages, int stage, int micro_batches,
                                 int chunks = 1);

// Checks the sequences of all `stages` stages together, over the
// stages * chunks virtual stages (chunk c of stage s is virtual stage
// c * stages + s; one chunk: the stages themselves). Adjacent virtual
// stages must run their forwards in the same micro-batch order, and their
// backwards too. Then it plays them as the pipeline runs them: a virtual
// stage's forward of micro-batch k waits for the previous one's, its
// backward for the next one's. Returns "" when every unit runs, else what
// is wrong: the orders that disagree, or, when the stages wait on each
// other, where each waits. A stage's own sequence that does not hold
// throws, as StageActions does.
std::string CheckSchedule(const std::string& schedule, int stages, int micro_batches, int chunks = 1);

// "F0 F1 B0 F2 B1 B2" ("W1" for a weight-gradient unit; "F2c1" for chunk 1
// when any unit's chunk is not 0).
std::string ActionsText(const std::vector<Action>& actions);

// Checks a stage's action trace: each micro-batch 0..micro_batches-1 of
// each chunk 0..chunks-1 runs one forward and one backward, the forward
// first, and, when any W unit is listed, one W after its backward. Returns
// "" when it holds, else what is wrong ("B3 before F3", "F2 twice", "no
// B5", "W1 before B1", "no W4", "F0c2 is beyond the 2 chunks").
std::string ValidateActions(const std::vector<Action>& actions, int micro_batches, int chunks = 1);

// The most micro-batches whose forward has run and backward not yet (their
// W not yet, when the trace lists W units), over the trace: the
// activations the stage keeps at once (a micro-batch in two chunks counts
// twice: each chunk keeps its own).
int MaxInFlight(const std::vector<Action>& actions);

}  // namespace tessel::runtime
