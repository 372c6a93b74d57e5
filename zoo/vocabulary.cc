#include "zoo/vocabulary.h"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessel::zoo {
namespace {

constexpr uintmax_t kMaxVocabularyFileBytes = uintmax_t{64} << 20;  // GPT-2's vocab.json is 1 MB
constexpr size_t kMaxTokenBytes = 1024;

}  // namespace

std::vector<std::string> ParseVocabJson(std::string_view text, const std::string& where) {
  const nlohmann::json vocab = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TESSEL_CHECK(vocab.is_object()) << "vocabulary " << where << ": not a JSON object of token ids";
  const int64_t most = 2 * static_cast<int64_t>(vocab.size()) + 1024;
  std::vector<std::string> tokens;
  std::vector<char> taken;
  for (const auto& [token, id] : vocab.items()) {
    TESSEL_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < most)
        << "vocabulary " << where << ": token '" << token.substr(0, 64) << "' has id "
        << id.dump().substr(0, 64) << "; expected an integer id from 0, below " << most << " (twice the "
        << vocab.size() << " tokens, plus 1,024)";
    const size_t i = static_cast<size_t>(id.get<int64_t>());
    if (i >= tokens.size()) tokens.resize(i + 1), taken.resize(i + 1, 0);
    TESSEL_CHECK(!taken[i]) << "vocabulary " << where << ": id " << i << " is given to '"
                            << tokens[i].substr(0, 64) << "' and to '" << token.substr(0, 64) << "'";
    taken[i] = 1;
    tokens[i] = token;
  }
  return tokens;
}

std::vector<std::string> ParseTokenizerJson(std::string_view text, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TESSEL_CHECK(j.is_object() && j.contains("model") && j["model"].is_object() && j["model"].contains("vocab"))
      << "tokenizer " << where << ": not a tokenizer.json (an object with a \"model\" holding a \"vocab\")";
  const nlohmann::json& vocab = j["model"]["vocab"];
  const nlohmann::json empty = nlohmann::json::array();
  const nlohmann::json& added =
      j.contains("added_tokens") && !j["added_tokens"].is_null() ? j["added_tokens"] : empty;
  TESSEL_CHECK((vocab.is_object() || vocab.is_array()) && added.is_array())
      << "tokenizer " << where
      << ": \"model.vocab\" must be an object of ids or a list of [token, score] and "
         "\"added_tokens\" a list";
  const int64_t most = 2 * static_cast<int64_t>(vocab.size() + added.size()) + 1024;
  std::vector<std::string> tokens;
  std::vector<char> taken;
  // Gives `id` to `token`; `repeat_ok`: an added token may restate an entry.
  auto give = [&](const std::string& token, const nlohmann::json& id, bool repeat_ok) {
    TESSEL_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < most)
        << "tokenizer " << where << ": token '" << token.substr(0, 64) << "' has id "
        << id.dump().substr(0, 64) << "; expected an integer id from 0, below " << most;
    const size_t i = static_cast<size_t>(id.get<int64_t>());
    if (i >= tokens.size()) tokens.resize(i + 1), taken.resize(i + 1, 0);
    TESSEL_CHECK(!taken[i] || (repeat_ok && tokens[i] == token))
        << "tokenizer " << where << ": id " << i << " is given to '" << tokens[i].substr(0, 64)
        << "' and to '" << token.substr(0, 64) << "'";
    taken[i] = 1;
    tokens[i] = token;
  };
  if (vocab.is_object()) {
    for (const auto& [token, id] : vocab.items()) give(token, id, false);
  } else {
    int64_t index = 0;
    for (const nlohmann::json& entry : vocab) {
      TESSEL_CHECK(entry.is_array() && !entry.empty() && entry[0].is_string())
          << "tokenizer " << where << ": entry " << index << " of \"model.vocab\" is "
          << entry.dump().substr(0, 64) << "; expected [token, score]";
      give(entry[0].get<std::string>(), nlohmann::json(index++), false);
    }
  }
  for (const nlohmann::json& t : added) {
    TESSEL_CHECK(t.is_object() && t.contains("id") && t.contains("content") && t["content"].is_string())
        << "tokenizer " << where << ": an added token is " << t.dump().substr(0, 64)
        << "; expected {\"id\": ..., \"content\": ...}";
    give(t["content"].get<std::string>(), t["id"], true);
  }
  TESSEL_CHECK(!tokens.empty()) << "tokenizer " << where << " holds no tokens";
  return tokens;
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
  const nlohmann::json j =
      nlohmann::json::parse(ReadVocabularyFile(file), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    return j.is_object();  // a vocab.json
  const nlohmann::json& decoder = j.contains("decoder") ? j["decoder"] : nlohmann::json();
  return decoder.is_object() && decoder.contains("type") && decoder["type"] == "ByteLevel";
}

std::vector<std::string> ReadVocabulary(const std::filesystem::path& file) {
  const std::string text = ReadVocabularyFile(file);
  if (file.extension() != ".json") return ParseVocabTxt(text, file.string());
  // A vocab.json maps tokens to ids ("model" is a word GPT-2 knows: an id);
  // a tokenizer.json's "model" is an object.
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool tokenizer = j.is_object() && j.contains("model") && j["model"].is_object();
  return tokenizer ? ParseTokenizerJson(text, file.string()) : ParseVocabJson(text, file.string());
}

}  // namespace tessel::zoo
