#include "checkpoint/hugging_face_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "zoo/vocabulary.h"

namespace tessel::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr uintmax_t kMaxTokenizerFileBytes = uintmax_t{64} << 20;  // GPT-2's vocab.json is 1 MB

std::string ReadSmallFile(const fs::path& path) {
  std::error_code error;
  const uintmax_t size = fs::file_size(path, error);
  TESSEL_CHECK(!error) << "tokenizer: cannot read " << path.string() << " (" << error.message() << ")";
  TESSEL_CHECK(size <= kMaxTokenizerFileBytes)
      << "tokenizer: " << path.string() << " is " << size << " bytes; expected at most " << kMaxTokenizerFileBytes;
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TESSEL_CHECK(in.good() || in.eof()) << "tokenizer: reading " << path.string() << " failed";
  return text;
}

// Writes `text` to `path` through a temporary file.
void WriteFile(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    TESSEL_CHECK(out.good()) << "Hugging Face export: cannot write " << tmp.string();
  }
  fs::rename(tmp, path);
}

}  // namespace

std::vector<std::string> Gpt2Vocabulary(std::string_view vocab_json, int64_t vocab_size, const std::string& where) {
  TESSEL_CHECK(vocab_size >= 0) << "tokenizer " << where << ": a vocabulary of " << vocab_size << " tokens";
  std::vector<std::string> tokens = zoo::ParseVocabJson(vocab_json, "of tokenizer " + where);
  TESSEL_CHECK(static_cast<int64_t>(tokens.size()) <= vocab_size)
      << "tokenizer " << where << ": token '" << tokens.back().substr(0, 64) << "' has id " << tokens.size() - 1
      << "; expected ids below the model's vocabulary of " << vocab_size;
  tokens.resize(static_cast<size_t>(vocab_size));
  return tokens;
}

int64_t EndOfTextId(std::string_view vocab_json, int64_t vocab_size, const std::string& where) {
  const std::vector<std::string> tokens = Gpt2Vocabulary(vocab_json, vocab_size, where);
  const auto found = std::find(tokens.begin(), tokens.end(), "<|endoftext|>");
  TESSEL_CHECK(found != tokens.end()) << "tokenizer " << where
                                      << ": no '<|endoftext|>' token; expected GPT-2's end-of-text token";
  return found - tokens.begin();
}

std::string DecodeGpt2(const std::vector<std::string>& vocabulary, const std::vector<int64_t>& ids) {
  // GPT-2's byte-level alphabet: the printable bytes (! to ~, ¡ to ¬, ® to
  // ÿ) stand for themselves, the others for code points 256, 257, ... in
  // byte order.
  static const std::vector<int> byte_of_code_point = [] {
    std::vector<int> byte_of(512, -1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_of[static_cast<size_t>(printable ? b : next++)] = b;
    }
    return byte_of;
  }();
  std::string bytes;
  for (const int64_t id : ids) {
    TESSEL_CHECK(id >= 0 && static_cast<size_t>(id) < vocabulary.size())
        << "decode: id " << id << " is outside the vocabulary of " << vocabulary.size() << " tokens";
    const std::string& token = vocabulary[static_cast<size_t>(id)];
    // UTF-8 code points of the token, each one byte of the text.
    for (size_t i = 0; i < token.size();) {
      const unsigned char lead = static_cast<unsigned char>(token[i]);
      const size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : 4;
      uint32_t code_point = length == 1 ? lead : lead & (0x3F >> (length - 1));
      for (size_t k = 1; k < length && i + k < token.size(); ++k)
        code_point = (code_point << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
      i += length;
      if (code_point < byte_of_code_point.size() && byte_of_code_point[code_point] >= 0)
        bytes.push_back(static_cast<char>(byte_of_code_point[code_point]));
    }
  }
  // As UTF-8, a byte that starts no valid sequence (a character whose
  // bytes the ids cut) replaced by U+FFFD, as Hugging Face's decode does.
  std::string text;
  for (size_t i = 0; i < bytes.size();) {
    const unsigned char lead = static_cast<unsigned char>(bytes[i]);
    const size_t length = lead < 0x80 ? 1 : lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3
                                                                         : lead >= 0xF0 && lead <= 0xF4 ? 4
                                                                                                        : 0;
    bool valid = length > 0 && i + length <= bytes.size();
    for (size_t k = 1; valid && k < length; ++k) valid = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (valid && length == 3) {  // no overlong forms, no surrogates
      const unsigned char second = static_cast<unsigned char>(bytes[i + 1]);
      valid = !(lead == 0xE0 && second < 0xA0) && !(lead == 0xED && second >= 0xA0);
    }
    if (valid && length == 4) {
      const unsigned char second = static_cast<unsigned char>(bytes[i + 1]);
      valid = !(lead == 0xF0 && second < 0x90) && !(lead == 0xF4 && second >= 0x90);
    }
    if (valid) {
      text.append(bytes, i, length);
      i += length;
    } else {
      text.append("\xEF\xBF\xBD");
      ++i;
    }
  }
  return text;
}

Gpt2Tokenizer ReadGpt2Tokenizer(const fs::path& dir, int64_t vocab_size) {
  Gpt2Tokenizer t;
  t.vocab = dir / "vocab.json";
  t.merges = dir / "merges.txt";
  TESSEL_CHECK(fs::is_regular_file(t.vocab) && fs::is_regular_file(t.merges))
      << "tokenizer: " << dir.string()
      << " does not hold vocab.json and merges.txt (a GPT-2 byte-level BPE, as tools/preprocess_data.py takes)";
  t.end_of_text_id = EndOfTextId(ReadSmallFile(t.vocab), vocab_size, t.vocab.string());
  std::error_code error;
  TESSEL_CHECK(fs::file_size(t.merges, error) <= kMaxTokenizerFileBytes && !error)
      << "tokenizer: " << t.merges.string() << " is unreadable or larger than " << kMaxTokenizerFileBytes
      << " bytes";
  return t;
}

void WriteGpt2Tokenizer(const fs::path& hf_dir, const Gpt2Tokenizer& t) {
  fs::copy_file(t.vocab, hf_dir / "vocab.json", fs::copy_options::overwrite_existing);
  fs::copy_file(t.merges, hf_dir / "merges.txt", fs::copy_options::overwrite_existing);
  const nlohmann::json special = {{"bos_token", t.end_of_text}, {"eos_token", t.end_of_text},
                                  {"unk_token", t.end_of_text}};
  nlohmann::json tokenizer_config = special;
  tokenizer_config["tokenizer_class"] = "GPT2Tokenizer";
  tokenizer_config["add_prefix_space"] = false;
  tokenizer_config["model_max_length"] = 1 << 30;
  WriteFile(hf_dir / "special_tokens_map.json", special.dump(2) + "\n");
  WriteFile(hf_dir / "tokenizer_config.json", tokenizer_config.dump(2) + "\n");
  // The model's config (written by the export) names the special tokens too.
  nlohmann::json config = nlohmann::json::parse(ReadSmallFile(hf_dir / "config.json"), nullptr, false);
  TESSEL_CHECK(config.is_object()) << "Hugging Face export: " << (hf_dir / "config.json").string()
                                   << " is not a JSON object";
  config["bos_token_id"] = t.end_of_text_id;
  config["eos_token_id"] = t.end_of_text_id;
  WriteFile(hf_dir / "config.json", config.dump(2) + "\n");
}

}  // namespace tessel::checkpoint
