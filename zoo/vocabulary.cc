#include "zoo/vocabulary.h"

#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessel::zoo {
namespace {

constexpr uintmax_t kMaxVocabularyFileBytes = uintmax_t{64} << 20;  // GPT-2's vocab.json is 1 MB
constexpr size_t kMaxTokenBytes = 1024;

}  // namespace

namespace {
// Tokens by id, filled entry by entry: each id an integer from 0 below
// `most` (so what the table allocates is bounded by the entries), given to
// one token (an added token may restate its entry).
class TokensById {
 public:
  TokensById(std::string what, int64_t most) : what_(std::move(what)), most_(most) {}
  void Give(const std::string& token, const nlohmann::json& id, bool restate_ok = false) {
    TESSEL_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < most_)
        << what_ << ": token '" << token.substr(0, 64) << "' has id " << id.dump().substr(0, 64)
        << "; expected an integer id from 0, below " << most_ << " (twice the entries, plus 1,024)";
    const size_t i = static_cast<size_t>(id.get<int64_t>());
    if (i >= tokens_.size()) tokens_.resize(i + 1), taken_.resize(i + 1, 0);
    TESSEL_CHECK(!taken_[i] || (restate_ok && tokens_[i] == token))
        << what_ << ": id " << i << " is given to '" << tokens_[i].substr(0, 64) << "' and to '"
        << token.substr(0, 64) << "'";
    taken_[i] = 1;
    tokens_[i] = token;
  }
  std::vector<std::string> Take() { return std::move(tokens_); }

 private:
  std::string what_;
  int64_t most_;
  std::vector<std::string> tokens_;
  std::vector<char> taken_;
};

int64_t MostIds(size_t entries) { return 2 * static_cast<int64_t>(entries) + 1024; }

bool IsTokenizerJson(const nlohmann::json& j) {
  // A vocab.json maps tokens to ids ("model" is a word GPT-2 knows: an id);
  // a tokenizer.json's "model" is an object.
  return j.is_object() && j.contains("model") && j["model"].is_object();
}

std::vector<std::string> VocabJsonTokens(const nlohmann::json& vocab, const std::string& where) {
  TESSEL_CHECK(vocab.is_object()) << "vocabulary " << where << ": not a JSON object of token ids";
  TokensById tokens("vocabulary " + where, MostIds(vocab.size()));
  for (const auto& [token, id] : vocab.items()) tokens.Give(token, id);
  return tokens.Take();
}

std::vector<std::string> TokenizerJsonTokens(const nlohmann::json& j, const std::string& where) {
  TESSEL_CHECK(IsTokenizerJson(j) && j["model"].contains("vocab"))
      << "tokenizer " << where << ": not a tokenizer.json (an object with a \"model\" holding a \"vocab\")";
  const nlohmann::json& vocab = j["model"]["vocab"];
  const nlohmann::json empty = nlohmann::json::array();
  const nlohmann::json& added =
      j.contains("added_tokens") && !j["added_tokens"].is_null() ? j["added_tokens"] : empty;
  TESSEL_CHECK((vocab.is_object() || vocab.is_array()) && added.is_array())
      << "tokenizer " << where
      << ": \"model.vocab\" must be an object of ids or a list of [token, score] and "
         "\"added_tokens\" a list";
  TokensById tokens("tokenizer " + where, MostIds(vocab.size() + added.size()));
  if (vocab.is_object()) {
    for (const auto& [token, id] : vocab.items()) tokens.Give(token, id);
  } else {
    int64_t index = 0;
    for (const nlohmann::json& entry : vocab) {
      TESSEL_CHECK(entry.is_array() && !entry.empty() && entry[0].is_string())
          << "tokenizer " << where << ": entry " << index << " of \"model.vocab\" is "
          << entry.dump().substr(0, 64) << "; expected [token, score]";
      tokens.Give(entry[0].get<std::string>(), nlohmann::json(index++));
    }
  }
  for (const nlohmann::json& t : added) {
    TESSEL_CHECK(t.is_object() && t.contains("id") && t.contains("content") && t["content"].is_string())
        << "tokenizer " << where << ": an added token is " << t.dump().substr(0, 64)
        << "; expected {\"id\": ..., \"content\": ...}";
    tokens.Give(t["content"].get<std::string>(), t["id"], /*restate_ok=*/true);
  }
  std::vector<std::string> out = tokens.Take();
  TESSEL_CHECK(!out.empty()) << "tokenizer " << where << " holds no tokens";
  return out;
}

nlohmann::json ParseJson(std::string_view text) {
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}
}  // namespace

std::vector<std::string> ParseVocabJson(std::string_view text, const std::string& where) {
  return VocabJsonTokens(ParseJson(text), where);
}

std::vector<std::string> ParseTokenizerJson(std::string_view text, const std::string& where) {
  return TokenizerJsonTokens(ParseJson(text), where);
}

std::vector<std::string> ParseVocabTxt(std::string_view text, const std::string& where) {
  std::vector<std::string> tokens;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    TESSEL_CHECK(line.size() <= kMaxTokenBytes)
        << "vocabulary " << where << ": line " << tokens.size() + 1 << " is " << line.size()
        << " bytes; expected one token per line (at most " << kMaxTokenBytes << " bytes)";
    tokens.emplace_back(line);
    start = end + 1;
  }
  TESSEL_CHECK(!tokens.empty()) << "vocabulary " << where << " is empty; expected one token per line";
  return tokens;
}

namespace {
// The file's bytes, at most kMaxVocabularyFileBytes.
std::string ReadVocabularyFile(const std::filesystem::path& file) {
  TESSEL_CHECK(std::filesystem::is_regular_file(file))
      << "vocabulary " << file.string()
      << " is not a file; expected a vocab.json, tokenizer.json or vocab.txt";
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(file, error);
  TESSEL_CHECK(!error) << "vocabulary " << file.string() << " cannot be read (" << error.message() << ")";
  TESSEL_CHECK(size <= kMaxVocabularyFileBytes) << "vocabulary " << file.string() << " is " << size
                                                << " bytes; expected at most " << kMaxVocabularyFileBytes;
  std::ifstream in(file, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TESSEL_CHECK(in.good() || in.eof()) << "vocabulary " << file.string() << ": reading failed";
  return text;
}
}  // namespace

bool IsByteLevelVocabulary(const std::filesystem::path& file) {
  if (file.extension() != ".json") return false;
  const nlohmann::json j = ParseJson(ReadVocabularyFile(file));
  if (!IsTokenizerJson(j)) return j.is_object();  // a vocab.json: GPT-2's byte-level pieces
  const nlohmann::json& decoder = j.contains("decoder") ? j["decoder"] : nlohmann::json();
  return decoder.is_object() && decoder.contains("type") && decoder["type"] == "ByteLevel";
}

std::vector<std::string> ReadVocabulary(const std::filesystem::path& file) {
  const std::string text = ReadVocabularyFile(file);
  if (file.extension() != ".json") return ParseVocabTxt(text, file.string());
  const nlohmann::json j = ParseJson(text);  // parsed once, read as either kind
  return IsTokenizerJson(j) ? TokenizerJsonTokens(j, file.string()) : VocabJsonTokens(j, file.string());
}

}  // namespace tessel::zoo
