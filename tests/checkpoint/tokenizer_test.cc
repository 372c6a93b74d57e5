// A GPT-2 byte-level BPE's vocabulary read by id, and ids decoded back to
// the bytes they stand for (GPT-2's alphabet: printable bytes as
// themselves, the others as code points 256 and up).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/hugging_face_tokenizer.h"
#include "core/error.h"

namespace tessel::checkpoint {
namespace {

TEST(Gpt2Tokenizer, VocabularyByIdAndDecodedBytes) {
  // "Ġ" (U+0120) is the space, "Ċ" (U+010A) the newline, "Ã©" the two
  // bytes of UTF-8 'é'.
  const std::string json =
      R"({"<|endoftext|>": 0, "Hello": 1, "\u0120world": 2, "\u010a": 3, "caf": 4, "\u00c3\u00a9": 5, "!": 7})";
  const std::vector<std::string> vocabulary = Gpt2Vocabulary(json, 8, "test");
  ASSERT_EQ(vocabulary.size(), 8u);
  EXPECT_EQ(vocabulary[2], "\xc4\xa0world");
  EXPECT_EQ(vocabulary[6], "");  // no token has id 6
  EXPECT_EQ(EndOfTextId(json, 8, "test"), 0);
  EXPECT_EQ(DecodeGpt2(vocabulary, {1, 2, 7, 3, 4, 5}), "Hello world!\ncaf\xc3\xa9");
  EXPECT_EQ(DecodeGpt2(vocabulary, {}), "");
  // 'é' cut after its first byte: U+FFFD, then the rest.
  std::vector<std::string> cut = vocabulary;
  cut[6] = "\xc3\x83";  // "Ã": the byte 0xC3 alone
  EXPECT_EQ(DecodeGpt2(cut, {4, 6, 7}), "caf\xef\xbf\xbd!");
  EXPECT_THROW(DecodeGpt2(vocabulary, {8}), Error);
  EXPECT_THROW(DecodeGpt2(vocabulary, {-1}), Error);
  EXPECT_THROW(Gpt2Vocabulary(json, 6, "test"), Error);  // "!" is id 7
  EXPECT_THROW(Gpt2Vocabulary("[1, 2]", 6, "test"), Error);
}

}  // namespace
}  // namespace tessel::checkpoint
