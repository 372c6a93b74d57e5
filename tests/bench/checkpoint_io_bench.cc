// Checkpoint save and load throughput, and what a resharding load reads.
// Run under tessel-launch; tests/bench/checkpoint_io_vs_torch.py runs the
// whole comparison (and the PyTorch peer).
//
//   --mode save  builds a GPT (GPT-2 124M by default) and its AdamW state
//                under --tp/--pp, saves a checkpoint into --dir, prints the
//                time and bytes written.
//   --mode load  builds the same model under this launch's --tp/--pp,
//                drops the checkpoint's shards from the page cache (cold
//                read), loads it and prints per rank the bytes its boxes
//                need, the bytes of the chunks it read, what the kernel read
//                from the disk for it (/proc/self/io read_bytes) and the time.
#include <fcntl.h>
#include <gflags/gflags.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/checkpoint.h"
#include "core/comm/process_group.h"
#include "graph/init.h"
#include "layers/dist.h"
#include "layers/optimizer.h"
#include "models/gpt.h"

DEFINE_string(mode, "save", "save or load");
DEFINE_string(dir, "", "checkpoint directory (save: created; load: a checkpoint or its parent)");
DEFINE_int64(tp, 1, "tensor parallel size");
DEFINE_int64(pp, 1, "pipeline parallel size");
DEFINE_int64(layers, 12, "transformer layers");
DEFINE_int64(hidden, 768, "hidden size");
DEFINE_int64(heads, 12, "attention heads");
DEFINE_int64(vocab, 50257, "vocabulary (padded to 128 x tp inside the model)");
DEFINE_int64(seq, 1024, "positions");
DEFINE_int64(chunk_kib, 256, "save: the chunk bound (KiB)");
DEFINE_bool(one_at_a_time, false,
            "load: ranks load in turn, each after dropping the shards from the page cache, so a rank's disk "
            "reads are its own (concurrent ranks that need the same bytes share the page cache)");

using namespace tessel;

namespace {

int64_t DiskReadBytes() {
  std::ifstream in("/proc/self/io");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("read_bytes:", 0) == 0) return std::stoll(line.substr(11));
  return -1;
}

// Clean pages of the checkpoint's files leave the page cache, so the load
// reads from the disk (no root needed; the save fsynced them).
void DropFromPageCache(const std::filesystem::path& checkpoint) {
  for (const auto& entry : std::filesystem::directory_iterator(checkpoint)) {
    const int fd = ::open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("checkpoint_io_bench --mode save|load --dir DIR [--tp N --pp N]");
  tessel::Init(&argc, &argv);
  dist::Setup({.tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = FLAGS_layers});
  models::GPT gpt({.vocab_size = FLAGS_vocab,
                   .hidden = FLAGS_hidden,
                   .heads = FLAGS_heads,
                   .layers = FLAGS_layers,
                   .max_seq = FLAGS_seq,
                   .activation = layers::Activation::kGeluTanh});
  auto params = gpt.NamedParameters();
  optim::AdamW adamw(params, {});
  checkpoint::NamedTensors tensors;
  for (auto& [name, p] : params) tensors.emplace_back("model." + name, p);
  for (auto& [name, s] : adamw.NamedState()) tensors.emplace_back("optim." + name, s);
  const int rank = dist::Rank();
  comm::Communicator& world = comm::World();
  using Clock = std::chrono::steady_clock;
  char line[512];
  if (FLAGS_mode == "save") {
    checkpoint::SaveOptions options;
    options.keep_last = 0;
    options.chunk_bytes = FLAGS_chunk_kib << 10;
    world.Barrier();
    const auto start = Clock::now();
    const std::filesystem::path saved = checkpoint::Save(FLAGS_dir, 1, tensors, {{"arch", "gpt2"}}, options);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const auto shard = saved / (std::string("shard-") + [&] {
                         char n[40];
                         std::snprintf(n, sizeof(n), "%05d-of-%05d.safetensors", rank, dist::WorldSize());
                         return std::string(n);
                       }());
    std::snprintf(line, sizeof(line), "save rank %d: wrote %.1f MB in %.3f s\n", rank,
                  static_cast<double>(std::filesystem::file_size(shard)) / 1e6, seconds);
    std::fputs(line, stdout);
    return 0;
  }
  TESSEL_CHECK(FLAGS_mode == "load") << "--mode " << FLAGS_mode << "; expected save or load";
  const std::filesystem::path found = checkpoint::Find(FLAGS_dir);
  TESSEL_CHECK(!found.empty()) << FLAGS_dir << " holds no checkpoint";
  checkpoint::LoadStats stats;
  checkpoint::LoadOptions options;
  options.stats = &stats;
  for (const char* key : {"model.wte.weight", "optim.wte.weight.exp_avg", "optim.wte.weight.exp_avg_sq"})
    options.padded_rows[key] = FLAGS_vocab;
  int64_t disk = 0;
  double seconds = 0;
  const int turns = FLAGS_one_at_a_time ? dist::WorldSize() : 1;
  if (!FLAGS_one_at_a_time) DropFromPageCache(found);
  world.Barrier();
  for (int turn = 0; turn < turns; ++turn) {
    if (!FLAGS_one_at_a_time || turn == rank) {
      if (FLAGS_one_at_a_time) DropFromPageCache(found);
      const int64_t disk_before = DiskReadBytes();
      const auto start = Clock::now();
      checkpoint::Load(found, tensors, options);
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
      disk = DiskReadBytes() - disk_before;
    }
    if (FLAGS_one_at_a_time) world.Barrier();
  }
  std::snprintf(line, sizeof(line),
                "load rank %d: needed %lld bytes, chunks read %lld bytes (%lld chunks), disk read %lld bytes "
                "(%.4f x needed) in %.3f s\n",
                rank, static_cast<long long>(stats.bytes_needed), static_cast<long long>(stats.bytes_read),
                static_cast<long long>(stats.chunks_read), static_cast<long long>(disk),
                static_cast<double>(disk) / static_cast<double>(std::max<int64_t>(1, stats.bytes_needed)),
                seconds);
  std::fputs(line, stdout);
  return 0;
}
