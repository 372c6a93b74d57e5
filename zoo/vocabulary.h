// Tokenizer vocabularies as the data's preprocessing took them
// (tools/preprocess_data.py): a GPT-2 byte-level BPE's vocab.json
// ({"token": id, ...}), a WordPiece vocab.txt (one token per line, its
// id the line's number) and a Hugging Face tokenizer.json (Llama's, T5's:
// the model's vocabulary plus its added special tokens). A config's data.vocab_file gives the model its
// vocabulary size and BERT its special tokens' ids from the same file.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::zoo {

// The tokens of a vocab.json by id (ids no token has: ""). Throws naming
// `where` unless the text is a JSON object of distinct integer ids from 0,
// at most twice as many ids as tokens (plus 1,024): sparse beyond that is
// not a vocabulary, and what it would allocate is bounded so.
std::vector<std::string> ParseVocabJson(std::string_view text, const std::string& where);
// The tokens of a tokenizer.json by id: its model's "vocab" (an object of
// token ids, BPE's and WordPiece's, or Unigram's list of [token, score]
// pairs) and its "added_tokens" ({"id", "content"}), which may repeat a
// vocabulary entry but not give its id another token. Ids are bounded as
// ParseVocabJson's; throws naming `where`.
std::vector<std::string> ParseTokenizerJson(std::string_view text, const std::string& where);
// The tokens of a vocab.txt by id: its lines (a trailing "\r" dropped).
// Throws naming `where` on an empty file or a token line longer than 1 KiB.
std::vector<std::string> ParseVocabTxt(std::string_view text, const std::string& where);
// A vocabulary file (at most 64 MB): a ".json" file is a tokenizer.json
// when it has a "model" object, else a vocab.json; other files are
// vocab.txt. Throws naming the file.
std::vector<std::string> ReadVocabulary(const std::filesystem::path& file);
// Whether the file's tokens are byte-level BPE pieces (GPT-2's alphabet of
// 256 printable stand-ins for bytes), so they decode to text as GPT-2's do:
// a vocab.json, or a tokenizer.json whose decoder is ByteLevel (Llama 3's).
// A vocab.txt or a SentencePiece-style tokenizer.json is not.
bool IsByteLevelVocabulary(const std::filesystem::path& file);

}  // namespace tessel::zoo
