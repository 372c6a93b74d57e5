// safetensors writing: the header's JSON (sorted names, dtypes, shapes,
// contiguous offsets, metadata), its 8-byte alignment, the data bytes, and
// the errors; reading: a round trip, other dtypes as bytes, and every kind
// of malformed header named. test_hf_gpt2.py reads files written here with
// the `safetensors` package itself; the bundled digits file, written by that
// package, is read by the image dataset's tests.
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

TEST(Safetensors, ReadsBackWhatItWrites) {
  const auto path = std::filesystem::path(testing::TempDir()) / "round_trip.safetensors";
  const Tensor w = Tensor::FromVector<float>({1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f}, {2, 3});
  const Tensor ids = Tensor::FromVector<int64_t>({5, -7}, {2});
  const Tensor mask = Tensor::FromVector<bool>({true, false, true}, {3});
  const Tensor empty = Tensor::FromVector<float>({}, {0, 4});
  WriteSafetensors(path, {{"weight", w}, {"ids", ids}, {"mask", mask}, {"empty", empty}}, {{"format", "pt"}});
  const SafetensorsFile file(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.entries().size(), 4u);
  EXPECT_EQ(file.tensor("weight").shape(), Shape({2, 3}));
  EXPECT_EQ(file.tensor("weight").ToVector<float>(), w.ToVector<float>());
  EXPECT_EQ(file.tensor("ids").ToVector<int64_t>(), std::vector<int64_t>({5, -7}));
  EXPECT_EQ(file.tensor("mask").dtype(), DType::kBool);
  EXPECT_EQ(file.tensor("empty").shape(), Shape({0, 4}));
  EXPECT_EQ(file.bytes("ids").size(), 16u);
  try {
    file.tensor("bias");
    ADD_FAILURE() << "no error for a missing tensor";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor 'bias'; it holds: empty, ids, mask, weight"),
              std::string::npos)
        << e.what();
  }
}

// A file image with `json` as its header and `data_bytes` zero bytes of data.
std::string Image(const std::string& json, size_t data_bytes, uint64_t declared = UINT64_MAX) {
  const uint64_t n = declared == UINT64_MAX ? json.size() : declared;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\0');
}

std::string ParseError(const std::string& image) {
  try {
    ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "x.safetensors");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(Safetensors, ReadsOtherDTypesAsBytes) {
  const std::string image = Image(R"({"pixels":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]},)"
                                  R"("x":{"dtype":"F64","shape":[1],"data_offsets":[4,12]}})",
                                  12);
  const SafetensorsHeader h =
      ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "x");
  EXPECT_EQ(h.entries.at("pixels").dtype, "U8");
  EXPECT_EQ(h.entries.at("pixels").numel(), 4);
  EXPECT_EQ(h.entries.at("x").begin, 4u);
  EXPECT_EQ(h.data_offset, 8 + image.size() - 8 - 12);
}

TEST(Safetensors, NamesWhatIsWrongWithAHeader) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(ParseError(Image(ok, 8)), "no error");
  const std::pair<std::string, std::string> cases[] = {
      {"abc", "expected at least the 8-byte header size"},
      {Image(ok, 8, 1000), "declares a header of 1000 bytes"},
      {Image(ok, 8, uint64_t{1} << 62), "declares a header of"},
      {Image("{not json", 0), "is not a JSON object"},
      {Image("[1,2]", 0), "is not a JSON object"},
      {Image(ok, 4), "end past the data section of 4 bytes"},
      {Image(ok, 12), "cover 8 bytes of a data section of 12"},
      {Image(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype 'Q7'"},
      {Image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "expected non-negative integers"},
      {Image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "expected 3 elements x 4 bytes"},
      {Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", 8), "expected [begin, end]"},
      {Image(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
       "needs an object with dtype, shape and data_offsets"},
      {Image(R"({"a":{"dtype":"F32","shape":[562949953421312],"data_offsets":[0,8]}})", 8),
       "expected non-negative integers below 2^48"},
      {Image(R"({"a":{"dtype":"F32","shape":[65536,65536,65536,65536],"data_offsets":[0,8]}})", 8),
       "more elements than fit 64 bits"},
      {Image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
             3),
       "tensor 'b' of x.safetensors starts at byte 1 of the data; expected 2"},
      {Image(R"({"__metadata__":{"k":1}})", 0), "metadata 'k' of x.safetensors is not a string"},
  };
  for (const auto& [image, expected] : cases)
    EXPECT_NE(ParseError(image).find(expected), std::string::npos) << ParseError(image) << " / " << expected;
}

}  // namespace
}  // namespace tessel::zoo
