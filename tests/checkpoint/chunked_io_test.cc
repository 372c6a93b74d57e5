// Chunked checkpoint storage: the chunk grid, run visiting, and reading any
// box of a saved tensor back exactly, reading (and checking) only the
// chunks it overlaps.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>

#include "checkpoint/checkpoint.h"
#include "core/box_copy.h"
#include "tests/testing/test_util.h"
#include "zoo/safetensors.h"

namespace tessel::checkpoint {
namespace {

namespace fs = std::filesystem;

Tensor Iota(std::vector<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::FromVector<float>(v, Shape(dims));
}

// The box `box` of a row-major [rows, cols] iota, as floats.
std::vector<float> Expected(int64_t cols, const Box& box) {
  std::vector<float> out;
  for (int64_t r = box[0].begin; r < box[0].end; ++r)
    for (int64_t c = box[1].begin; c < box[1].end; ++c) out.push_back(static_cast<float>(r * cols + c));
  return out;
}

class ChunkedIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessel_chunked_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST(ChunkGrid, CutsTheLongestExtentUntilAChunkFits) {
  // GPT-2's QKV shard under tp2: 768 x 1152 floats (3.4 MiB) in chunks of
  // at most 256 KiB: columns, rows, columns, rows... by the longer extent,
  // in 1, 2, 6, 12, ... parts.
  EXPECT_EQ(ChunkGrid(Shape({768, 1152}), 4, 256 << 10), (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(ChunkGrid(Shape({50304, 768}), 4, 256 << 10), (std::vector<int64_t>{192, 6}));
  // The attention output's shard under tp2 (row-parallel: split on rows)
  // starts at 6 row parts, so tp3 or tp6 rows fall on chunk edges.
  EXPECT_EQ(ChunkGrid(Shape({384, 768}), 4, 256 << 10, {0}), (std::vector<int64_t>{6, 1}));
  EXPECT_EQ(ChunkGrid(Shape({384, 768}), 4, 256 << 10), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(ChunkGrid(Shape({768}), 4, 256 << 10, {0}), (std::vector<int64_t>{1}));  // fits
  EXPECT_EQ(ChunkGrid(Shape({768}), 4, 256 << 10), (std::vector<int64_t>{1}));       // fits
  EXPECT_EQ(ChunkGrid(Shape({0, 7}), 4, 16), (std::vector<int64_t>{1, 1}));          // empty
  EXPECT_EQ(ChunkGrid(Shape({3, 5}), 4, 1), (std::vector<int64_t>{3, 5}));  // one element each at most
  EXPECT_EQ(ChunkGrid(Shape({}), 8, 4), (std::vector<int64_t>{}));          // a scalar
}

// Chunk edges include the balanced split points of every part count that
// divides the grid's (6: 2, 3, 6; 12: 4 and 12 too; 24: 8 too), so a load
// under such a size reads no chunk that sticks out of its box.
TEST(ChunkGrid, EdgesFallOnTheSplitPointsOfOtherSizes) {
  for (int64_t parts : {6, 12, 24}) {
    const std::vector<Range> chunks = BalancedSplit(1152, parts);
    std::set<int64_t> edges;
    for (const Range& r : chunks) edges.insert(r.begin);
    for (int64_t t : {2, 3, 4, 6, 8, 12}) {
      if (parts % t != 0) continue;
      for (const Range& r : BalancedSplit(1152, t))
        EXPECT_TRUE(edges.count(r.begin)) << t << " parts begin at " << r.begin << "; chunks of " << parts;
    }
  }
}

TEST(Chunks, TileTheBoxInRowMajorOrder) {
  SavedBox saved{0, Box({{10, 17}, {0, 9}}), {2, 4}};
  const std::vector<Chunk> chunks = Chunks("w", saved);
  ASSERT_EQ(chunks.size(), 8u);
  int64_t covered = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].entry, "w#" + std::to_string(i));
    covered += chunks[i].box.numel();
    for (size_t j = 0; j < i; ++j) EXPECT_TRUE(chunks[i].box.Intersect(chunks[j].box).empty());
  }
  EXPECT_EQ(covered, saved.box.numel());
  EXPECT_EQ(chunks[0].box, Box({{10, 14}, {0, 3}}));  // balanced: larger parts first
  EXPECT_EQ(chunks[7].box, Box({{14, 17}, {7, 9}}));
  EXPECT_EQ(Chunks("b", SavedBox{0, Box({{0, 5}}), {}}).front().entry, "b");  // one chunk: the tensor's name
}

TEST(ForEachRun, VisitsTheBoxInItsOwnRowMajorOrder) {
  const Tensor t = Iota({4, 5, 6});
  const std::vector<int64_t> offset = {1, 2, 0}, box = {2, 3, 6};
  std::vector<float> visited;
  const auto* base = static_cast<const uint8_t*>(t.raw_data());
  int runs = 0;
  ForEachRun({4, 5, 6}, offset, box, 4, [&](int64_t at, size_t bytes) {
    ++runs;
    const auto* f = reinterpret_cast<const float*>(base + at);
    visited.insert(visited.end(), f, f + bytes / 4);
  });
  std::vector<float> copied(2 * 3 * 6);
  CopyBox(t.raw_data(), {4, 5, 6}, offset, copied.data(), box, {0, 0, 0}, box, 4);
  EXPECT_EQ(visited, copied);
  EXPECT_EQ(runs, 2);  // the last two dimensions are whole rows of 3 x 6 contiguous floats
}

TEST_F(ChunkedIo, AnyBoxReadsBackExactlyFromTheChunksItOverlaps) {
  Tensor w = Iota({37, 53});
  Tensor small = Iota({5});
  SaveOptions options;
  options.chunk_bytes = 1024;  // 37 x 53 floats (7.7 KiB) in chunks of <= 1 KiB
  const fs::path saved = Save(dir_, 3, {{"w", &w}, {"small", &small}}, {{"arch", "test"}}, options);
  Reader reader(saved);
  const SavedTensor& index = reader.index().tensors.at("w");
  ASSERT_EQ(index.boxes.size(), 1u);
  EXPECT_EQ(index.boxes[0].chunks, ChunkGrid(Shape({37, 53}), 4, 1024));
  EXPECT_TRUE(
      reader.index().tensors.at("small").boxes[0].chunks.empty());  // one chunk: the index says nothing
  std::mt19937 gen(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<Range> ranges;
    for (int64_t extent : {37, 53}) {
      int64_t a = std::uniform_int_distribution<int64_t>(0, extent - 1)(gen);
      int64_t b = std::uniform_int_distribution<int64_t>(0, extent - 1)(gen);
      ranges.push_back({std::min(a, b), std::max(a, b) + 1});
    }
    const Box box(ranges);
    std::vector<float> got(static_cast<size_t>(box.numel()));
    reader.ReadBox("w", box, got.data());
    EXPECT_EQ(got, Expected(53, box)) << box.ToString();
  }
  EXPECT_EQ(reader.ReadTensor("small").ToVector<float>(), small.ToVector<float>());
}

TEST_F(ChunkedIo, ABoxOnChunkEdgesReadsNothingElse) {
  Tensor w = Iota({72, 72});  // 20 KiB in a 6 x 6 grid of 12 x 12 chunks (576 bytes)
  SaveOptions options;
  options.chunk_bytes = 1024;
  Reader reader(Save(dir_, 1, {{"w", &w}}, {}, options));
  ASSERT_EQ(reader.index().tensors.at("w").boxes[0].chunks, (std::vector<int64_t>{6, 6}));
  const Box half_columns({{0, 72}, {36, 72}}), third_rows({{24, 48}, {0, 72}});
  std::vector<float> got(72 * 36);
  reader.ReadBox("w", half_columns, got.data());
  EXPECT_EQ(got, Expected(72, half_columns));
  EXPECT_EQ(reader.stats().bytes_read, reader.stats().bytes_needed);
  EXPECT_EQ(reader.stats().chunks_read, 18);
  got.resize(24 * 72);
  reader.ReadBox("w", third_rows, got.data());
  EXPECT_EQ(got, Expected(72, third_rows));
  EXPECT_EQ(reader.stats().bytes_read, (72 * 36 + 24 * 72) * 4);
  // A box off the edges reads the chunks it overlaps whole: 2 x 2 of them.
  got.resize(13 * 5);
  reader.ReadBox("w", Box({{11, 24}, {20, 25}}), got.data());
  EXPECT_EQ(got, Expected(72, Box({{11, 24}, {20, 25}})));
  EXPECT_EQ(reader.stats().bytes_read, (72 * 36 + 24 * 72 + 4 * 144) * 4);
}

TEST_F(ChunkedIo, ADamagedChunkIsNamedAndOnlyItsReadersFail) {
  Tensor w = Iota({72, 72});  // 6 x 6 chunks of 12 x 12
  SaveOptions options;
  options.chunk_bytes = 1024;
  const fs::path saved = Save(dir_, 1, {{"w", &w}}, {}, options);
  const fs::path shard = saved / "shard-00000-of-00001.safetensors";
  uint64_t offset = 0;
  {
    zoo::SafetensorsFile file(shard);
    offset = file.file_offset("w#7");  // rows 12..23, columns 12..23
  }
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset + 10));
    f.put('\x7f');
  }
  Reader reader(saved);
  std::vector<float> got(12 * 12);
  reader.ReadBox("w", Box({{0, 12}, {0, 12}}), got.data());  // chunk 0: intact
  EXPECT_EQ(got, Expected(72, Box({{0, 12}, {0, 12}})));
  got.assign(got.size(), -1.0f);
  const std::string error = testing::ErrorOf([&] {
    reader.ReadBox("w", Box({{6, 18}, {6, 18}}), got.data());
  });
  EXPECT_NE(error.find("tensor 'w' (chunk 'w#7'): checksum mismatch"), std::string::npos) << error;
  EXPECT_EQ(got, std::vector<float>(12 * 12, -1.0f));  // nothing was copied
}

TEST_F(ChunkedIo, VersionOneCheckpointsStillLoad) {
  Tensor w = Iota({8, 8});
  SaveOptions options;
  options.chunk_bytes = int64_t{1} << 30;  // one chunk per box: what version 1 wrote
  const fs::path saved = Save(dir_, 2, {{"w", &w}}, {}, options);
  nlohmann::json index = nlohmann::json::parse(std::ifstream(saved / "index.json"));
  EXPECT_FALSE(index["tensors"]["w"]["boxes"][0].contains("chunks"));
  index["version"] = 1;
  std::ofstream(saved / "index.json") << index.dump();
  Tensor loaded = Tensor::Empty(Shape({8, 8}), DType::kFloat32);
  Load(saved, {{"w", &loaded}});
  EXPECT_EQ(loaded.ToVector<float>(), w.ToVector<float>());
  index["version"] = 3;
  std::ofstream(saved / "index.json") << index.dump();
  EXPECT_NE(testing::ErrorOf([&] {
              Load(saved, {{"w", &loaded}});
            }).find("version 3; expected 1 to 2"),
            std::string::npos);
}

}  // namespace
// Each save carries an id in its index and in every shard: a shard from
// another save with the same names and shapes is refused; an index from
// before ids loads as it did; a malformed id is named.
TEST_F(ChunkedIo, AShardOfAnotherSaveIsRefused) {
  Tensor a = Iota({8, 8}), b = Iota({8, 8});
  for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] *= 2;
  const fs::path first = Save(dir_, 1, {{"w", &a}}, {}, {});
  const fs::path second = Save(dir_, 2, {{"w", &b}}, {}, {});
  const std::string shard = "shard-00000-of-00001.safetensors";
  fs::copy_file(second / shard, first / shard, fs::copy_options::overwrite_existing);
  Tensor loaded = Tensor::Empty(Shape({8, 8}), DType::kFloat32);
  const std::string error = testing::ErrorOf([&] { Load(first, {{"w", &loaded}}); });
  EXPECT_NE(error.find(shard + " belongs to another save"), std::string::npos) << error;
  // The same state saved again gets the same id (a resumed run writes the same bytes).
  const fs::path again = Save(dir_ / "again", 2, {{"w", &b}}, {}, {});
  nlohmann::json second_index = nlohmann::json::parse(std::ifstream(second / "index.json"));
  nlohmann::json again_index = nlohmann::json::parse(std::ifstream(again / "index.json"));
  EXPECT_EQ(second_index["save_id"], again_index["save_id"]);
  // Without an id (saved before ids): loads.
  second_index.erase("save_id");
  std::ofstream(second / "index.json") << second_index.dump();
  Load(second, {{"w", &loaded}});
  EXPECT_EQ(loaded.ToVector<float>(), b.ToVector<float>());
  second_index["save_id"] = "not hex!";
  std::ofstream(second / "index.json") << second_index.dump();
  EXPECT_NE(testing::ErrorOf([&] {
              Load(second, {{"w", &loaded}});
            }).find("save_id \"not hex!\""),
            std::string::npos);
}

}  // namespace tessel::checkpoint
