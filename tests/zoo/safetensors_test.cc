// safetensors writing: the header's JSON (sorted names, dtypes, shapes,
// contiguous offsets, metadata), its 8-byte alignment, the data bytes, and
// the errors. test_hf_gpt2.py reads files written here with the
// `safetensors` package itself.
#include "zoo/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tessel::zoo {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(Safetensors, WritesHeaderAlignmentAndData) {
  const auto path = std::filesystem::path(testing::TempDir()) / "safetensors_test.safetensors";
  const Tensor w = Tensor::FromVector<float>({1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f}, {2, 3});
  const Tensor ids = Tensor::FromVector<int64_t>({5, -7}, {2});
  const Tensor mask = Tensor::FromVector<bool>({true, false, true}, {3});
  WriteSafetensors(path, {{"weight", w}, {"ids", ids}, {"mask", mask}}, {{"format", "pt"}});

  const std::string bytes = ReadFile(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);  // little-endian host
  EXPECT_EQ(header_size % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + header_size + 6 * 4 + 2 * 8 + 3);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_size));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["weight"]["dtype"], "F32");
  EXPECT_EQ(header["weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["ids"]["dtype"], "I64");
  EXPECT_EQ(header["ids"]["data_offsets"], nlohmann::json({24, 40}));
  EXPECT_EQ(header["mask"]["dtype"], "BOOL");
  EXPECT_EQ(header["mask"]["data_offsets"], nlohmann::json({40, 43}));
  // The names are listed sorted, as the format's own writer lists them.
  std::vector<std::string> names;
  for (const auto& [name, value] : header.items()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"__metadata__", "ids", "mask", "weight"}));

  const char* data = bytes.data() + 8 + header_size;
  EXPECT_EQ(std::memcmp(data, w.raw_data(), 24), 0);
  EXPECT_EQ(std::memcmp(data + 24, ids.raw_data(), 16), 0);
  EXPECT_EQ(std::string(data + 40, 3), std::string("\1\0\1", 3));
}

TEST(Safetensors, NamesWhatItCannotWrite) {
  const auto path = std::filesystem::path(testing::TempDir()) / "bad.safetensors";
  const Tensor t = Tensor::FromVector<float>({1.0f}, {1});
  auto error = [&](const std::vector<std::pair<std::string, Tensor>>& tensors,
                   const std::filesystem::path& p) {
    try {
      WriteSafetensors(p, tensors);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error({{"a", t}, {"a", t}}, path).find("tensor name 'a' given twice"), std::string::npos);
  EXPECT_NE(error({{"u", Tensor()}}, path).find("tensor 'u'"), std::string::npos);
  EXPECT_NE(error({{"a", t}}, "/proc/no/such/dir/x.safetensors").find("cannot write /proc/no/such/dir"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel::zoo
