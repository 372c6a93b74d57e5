#include "checkpoint/hugging_face_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

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

int64_t EndOfTextId(std::string_view vocab_json, int64_t vocab_size, const std::string& where) {
  const nlohmann::json vocab = nlohmann::json::parse(vocab_json, nullptr, /*allow_exceptions=*/false);
  TESSEL_CHECK(vocab.is_object()) << "tokenizer " << where << ": not a JSON object of token ids";
  int64_t end_of_text = -1;
  for (const auto& [token, id] : vocab.items()) {
    TESSEL_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size)
        << "tokenizer " << where << ": token '" << token.substr(0, 64) << "' has id " << id.dump().substr(0, 64)
        << "; expected an integer id below the model's vocabulary of " << vocab_size;
    if (token == "<|endoftext|>") end_of_text = id.get<int64_t>();
  }
  TESSEL_CHECK(end_of_text >= 0) << "tokenizer " << where
                                 << ": no '<|endoftext|>' token; expected GPT-2's end-of-text token";
  return end_of_text;
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
