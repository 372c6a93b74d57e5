// tessel-plan: what each rank of a GPT training job would run, communicate
// and hold, without running it (tools/plan/gpt_plan.h).
//
//   tessel-plan --config configs/gpt3_175b.prototxt --device_memory 80GiB
//   tessel-plan --tp 4 --layers 24 --hidden 1024 --heads 16 --vocab 50304 --seq 1024 --rank 0
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/error.h"
#include "graph/init.h"
#include "graph/plan/rank_plan.h"
#include "layers/dist.h"
#include "tools/plan/gpt_plan.h"
#include "zoo/config.h"

DEFINE_string(config, "",
              "plan the job this training config describes (model, layout, batch sizes, schedule, "
              "recomputation, ZeRO, train.amp) instead of the model and layout flags; --set path=value "
              "(repeatable) overrides its fields as for tessel-train");
DEFINE_int32(world_size, 0,
             "with --config: the job's ranks (0: tensor x pipeline x the config's data_parallel_size, or 1 "
             "data-parallel rank when it leaves that to the world)");
DEFINE_string(
    schedule, "",
    "the pipeline schedule memory is planned under: 1f1b, gpipe, zb_h1, interleaved_1f1b or in_order "
    "(\"\": the config's train.graph.pipeline, else 1f1b)");
DEFINE_string(
    precision, "",
    "f32, or bf16 (compute in bf16 with f32 master weights and AdamW state, as train.amp); \"\": the "
    "config's train.amp, else f32");
DEFINE_string(device_memory, "", "each device's memory, e.g. 80GiB: the plan says whether every stage fits");
DEFINE_bool(calibrate, false,
            "estimate the step time on this machine: under tessel-launch with as many processes as the job "
            "would run here, every rank measures matmuls, elementwise ops, the runtime's cost per op and the "
            "collectives at once, and rank 0 prints the plan with the estimate");
DEFINE_double(gemm_tflops, 0,
              "estimate the step time on a machine whose f32 matmuls run at this many TFLOP/s "
              "(with --memory_gbps, --op_overhead_us, --link_gbps, --link_latency_us)");
DEFINE_double(memory_gbps, 0, "with --gemm_tflops: elementwise ops' GB/s (read and written)");
DEFINE_double(op_overhead_us, 0, "with --gemm_tflops: the runtime's cost per op, microseconds");
DEFINE_double(link_gbps, 0, "with --gemm_tflops: each rank's link for collectives and stage transfers, GB/s");
DEFINE_double(link_latency_us, 0,
              "with --gemm_tflops: a collective's or transfer's fixed cost, microseconds");

DEFINE_int64(tp, 1, "tensor parallel size");
DEFINE_int64(pp, 1, "pipeline parallel size");
DEFINE_int64(
    virtual_pipeline_size, 1,
    "model chunks per pipeline stage (interleaved 1F1B: the layers split into pp x this many parts)");
DEFINE_int64(dp, 1, "data parallel size (the world is tp x pp x dp)");
DEFINE_int32(rank, 0, "the rank whose plan to compile and print");
DEFINE_int64(layers, 2, "transformer layers");
DEFINE_int64(hidden, 64, "hidden size");
DEFINE_int64(heads, 4, "attention heads");
DEFINE_int64(ffn_hidden, 0, "feed-forward hidden size (0: 4 x hidden)");
DEFINE_int64(vocab, 1000, "vocabulary size");
DEFINE_int64(seq, 32, "tokens per sequence (also the position table's size)");
DEFINE_int64(micro_batch_size, 1, "sequences per micro-batch on each data-parallel rank");
DEFINE_int64(micro_batches, 1, "micro-batches per step (gradient accumulation, pipeline micro-batches)");
DEFINE_bool(activation_checkpoint, false, "recompute each transformer layer in backward");
DEFINE_bool(
    sequence_parallel, false,
    "sequence parallelism as --sequence_parallel_mode says: by default Megatron's (hidden states split "
    "on the sequence over tp between the tensor-parallel regions)");
DEFINE_string(
    sequence_parallel_mode, "megatron",
    "with --sequence_parallel: megatron (over tp), all_to_all (DeepSpeed-Ulysses: the dp ranks split "
    "each sequence; all-to-alls around attention trade it for a split of the heads) or context (the dp ranks "
    "split each sequence; each attention gathers the keys and values)");
DEFINE_int64(zero_stage, 0,
             "ZeRO over the data-parallel ranks: 1 optimizer state, 2 and gradients, 3 and parameters");
DEFINE_string(
    tensor_parallel_mode, "1d",
    "how the tp ranks lay out the layers: 1d (Megatron), 2d (SUMMA, tp = q x q), 2.5d (tp = depth x q "
    "x q, with --depth) or 3d (tp = q x q x q)");
DEFINE_int64(depth, 0, "with --tensor_parallel_mode 2.5d: the depth d of its d x q x q tensor mesh");
DEFINE_bool(ops, false, "also list every op of the rank's plan with its communication");
DEFINE_bool(
    instructions, false,
    "also list the rank's executable plan: the instructions the runtime runs, with their shard shapes "
    "and layouts");
DEFINE_string(dot, "", "write the compiled logical graph as Graphviz to this file");
DEFINE_string(plan_out, "", "write the rank's plan (tessel.proto.RankPlanProto, binary) to this file");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "prints what one rank of a GPT training job (forward, backward, gradient clipping, AdamW) would run, "
      "communicate and hold, compiled for the job's world on this machine without running it: "
      "communication per transformer layer and per parallel group, memory of each pipeline stage under "
      "the schedule (and whether it fits --device_memory), the pipeline bubble");
  const std::vector<std::string> overrides = tessel::zoo::TakeSetFlags(&argc, argv, "tessel-plan");
  FLAGS_logtostderr = true;    // the compiler's pass timings go to stderr, the plan to stdout
  tessel::Init(&argc, &argv);  // flags, logging and, under tessel-launch, the world (--calibrate)
  try {
    tessel::plan::GptPlanOptions o;
    if (!FLAGS_config.empty()) {
      // The config gives the model and the layout; their flags would be
      // silently ignored, so they are refused.
      for (const char* flag :
           {"tp", "pp", "dp", "virtual_pipeline_size", "layers", "hidden", "heads", "ffn_hidden", "vocab",
            "seq", "micro_batch_size", "micro_batches", "activation_checkpoint", "sequence_parallel",
            "sequence_parallel_mode", "zero_stage", "tensor_parallel_mode", "depth"}) {
        TESSEL_CHECK(gflags::GetCommandLineFlagInfoOrDie(flag).is_default)
            << "--" << flag << " with --config: the config sets the model and the layout; override its "
            << "fields with --set (e.g. --set train.dist.tensor_parallel_size=8)";
      }
      tessel::config::Config c = tessel::zoo::LoadConfig(FLAGS_config);
      tessel::zoo::ApplyOverrides(&c, overrides);
      int world = FLAGS_world_size;
      if (world == 0) world = tessel::zoo::WorldSizeOf(c.train().dist());
      o = tessel::plan::GptPlanOptionsFromConfig(c, world);
    } else {
      TESSEL_CHECK(overrides.empty()) << "--set " << overrides.front() << " needs --config";
      TESSEL_CHECK(FLAGS_world_size == 0)
          << "--world_size needs --config (without it the world is tp x pp x dp)";
      o.model.layers = FLAGS_layers;
      o.model.hidden = FLAGS_hidden;
      o.model.heads = FLAGS_heads;
      o.model.ffn_hidden = FLAGS_ffn_hidden;
      o.model.vocab_size = FLAGS_vocab;
      o.model.max_seq = FLAGS_seq;
      o.model.activation_checkpoint = FLAGS_activation_checkpoint;
      o.tensor_parallel_size = FLAGS_tp;
      o.pipeline_parallel_size = FLAGS_pp;
      o.data_parallel_size = FLAGS_dp;
      o.virtual_pipeline_size = FLAGS_virtual_pipeline_size;
      TESSEL_CHECK(FLAGS_sequence_parallel_mode == "megatron" ||
                   FLAGS_sequence_parallel_mode == "all_to_all" || FLAGS_sequence_parallel_mode == "context")
          << "--sequence_parallel_mode=" << FLAGS_sequence_parallel_mode
          << "; expected megatron, all_to_all or context";
      TESSEL_CHECK(FLAGS_sequence_parallel || FLAGS_sequence_parallel_mode == "megatron")
          << "--sequence_parallel_mode=" << FLAGS_sequence_parallel_mode << " needs --sequence_parallel";
      o.sequence_parallel = FLAGS_sequence_parallel && FLAGS_sequence_parallel_mode == "megatron";
      o.all_to_all_sequence_parallel =
          FLAGS_sequence_parallel && FLAGS_sequence_parallel_mode == "all_to_all";
      o.context_parallel = FLAGS_sequence_parallel && FLAGS_sequence_parallel_mode == "context";
      o.zero_stage = FLAGS_zero_stage;
      o.tensor_parallel_mode = FLAGS_tensor_parallel_mode;
      if (FLAGS_depth != 0) o.tensor_parallel_mode_options["depth"] = std::to_string(FLAGS_depth);
      o.micro_batch_size = FLAGS_micro_batch_size;
      o.micro_batches = FLAGS_micro_batches;
    }
    o.rank = FLAGS_rank;
    if (!FLAGS_schedule.empty()) o.schedule = FLAGS_schedule;
    if (!FLAGS_precision.empty()) {
      TESSEL_CHECK(FLAGS_precision == "f32" || FLAGS_precision == "bf16")
          << "--precision=" << FLAGS_precision << "; expected f32 or bf16";
      o.precision = FLAGS_precision == "bf16" ? tessel::plan::GptPlanOptions::Precision::kBf16
                                              : tessel::plan::GptPlanOptions::Precision::kF32;
    }
    if (!FLAGS_device_memory.empty())
      o.device_memory_bytes = tessel::plan::ParseByteSize(FLAGS_device_memory);
    tessel::plan::MachineModel machine;
    TESSEL_CHECK(!FLAGS_calibrate || FLAGS_gemm_tflops == 0)
        << "--calibrate measures this machine; --gemm_tflops states another: give one";
    if (FLAGS_calibrate) {
      machine = tessel::plan::CalibrateMachine();
      o.machine = &machine;
      if (tessel::dist::Rank() != 0) {  // rank 0 plans and prints; the others wait for it to end together
        tessel::comm::World().Barrier();
        return 0;
      }
    } else if (FLAGS_gemm_tflops > 0) {
      TESSEL_CHECK(FLAGS_memory_gbps > 0 && FLAGS_link_gbps > 0 && FLAGS_op_overhead_us >= 0 &&
                   FLAGS_link_latency_us >= 0)
          << "--gemm_tflops needs --memory_gbps and --link_gbps (> 0), --op_overhead_us and "
             "--link_latency_us "
             "(>= 0): the machine the estimate is for";
      machine.source = "given by flags";
      machine.gemm = {{1.0, FLAGS_gemm_tflops * 1e12}};
      machine.memory_bytes_per_s = FLAGS_memory_gbps * 1e9;
      machine.op_overhead_s = FLAGS_op_overhead_us * 1e-6;
      machine.collective_bytes_per_s = machine.p2p_bytes_per_s = FLAGS_link_gbps * 1e9;
      machine.collective_latency_s = machine.p2p_latency_s = FLAGS_link_latency_us * 1e-6;
      o.machine = &machine;
    } else {
      TESSEL_CHECK(tessel::dist::WorldSize() == 1)
          << "tessel-plan under tessel-launch is for --calibrate; without it, run one process";
    }
    o.want_dot = !FLAGS_dot.empty();
    o.want_instructions = FLAGS_instructions;
    const tessel::plan::GptPlan plan = tessel::plan::PlanGpt(o);
    if (FLAGS_instructions) std::fputs(plan.instructions.c_str(), stdout);
    if (FLAGS_ops) std::fputs(tessel::RankPlanText(plan.plan).c_str(), stdout);
    std::fputs(tessel::plan::GptPlanText(o, plan).c_str(), stdout);
    if (!FLAGS_dot.empty()) {
      std::ofstream f(FLAGS_dot);
      f << plan.dot;
      TESSEL_CHECK(f.good()) << "could not write --dot=" << FLAGS_dot;
    }
    if (!FLAGS_plan_out.empty()) {
      std::ofstream f(FLAGS_plan_out, std::ios::binary);
      TESSEL_CHECK(plan.plan.SerializeToOstream(&f) && f.good())
          << "could not write --plan_out=" << FLAGS_plan_out;
    }
    std::fflush(stdout);
    if (FLAGS_calibrate) tessel::comm::World().Barrier();
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "tessel-plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
