// The tokenizer of an exported GPT-2 (tessel-checkpoint export-hf
// --tokenizer DIR): the byte-level BPE files the data was tokenised with
// (vocab.json and merges.txt, as tools/preprocess_data.py takes them) go
// beside the model with Hugging Face's tokenizer files, and the model's
// config names the end-of-text token's id, so AutoTokenizer and
// generate() work on the export as on a hub model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>
#include <string_view>

namespace tessel::checkpoint {

struct Gpt2Tokenizer {
  std::filesystem::path vocab;   // vocab.json: {"token": id, ...}
  std::filesystem::path merges;  // merges.txt
  std::string end_of_text = "<|endoftext|>";
  int64_t end_of_text_id = -1;
};

// The tokens of the text of a vocab.json by id (ids it does not name:
// ""). Throws naming `where` unless the text is a JSON object of token
// ids, every one in [0, vocab_size).
std::vector<std::string> Gpt2Vocabulary(std::string_view vocab_json, int64_t vocab_size, const std::string& where);
// The id of "<|endoftext|>" in the text of a vocab.json. Throws as
// Gpt2Vocabulary does, and if the token is not there.
int64_t EndOfTextId(std::string_view vocab_json, int64_t vocab_size, const std::string& where);
// The text of `ids` under a byte-level BPE's tokens (GPT-2's: each byte
// stands as one printable character in a token), as UTF-8: a byte that
// starts no valid sequence (a character the ids cut) becomes U+FFFD, as
// Hugging Face's decode gives it. An id outside the vocabulary throws,
// naming it.
std::string DecodeGpt2(const std::vector<std::string>& vocabulary, const std::vector<int64_t>& ids);

// vocab.json and merges.txt in `dir` (each at most 64 MB), checked against
// a model of `vocab_size` rows. Throws naming the file.
Gpt2Tokenizer ReadGpt2Tokenizer(const std::filesystem::path& dir, int64_t vocab_size);

// Into an exported model's directory (config.json written): the two files,
// tokenizer_config.json and special_tokens_map.json (GPT2Tokenizer; the
// end-of-text token as bos, eos and unk), and the end-of-text id as
// config.json's bos_token_id and eos_token_id.
void WriteGpt2Tokenizer(const std::filesystem::path& hf_dir, const Gpt2Tokenizer& tokenizer);

}  // namespace tessel::checkpoint
