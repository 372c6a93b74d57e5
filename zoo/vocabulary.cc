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
        << "vocabulary " << where << ": token '" << token.substr(0, 64) << "' has id " << id.dump().substr(0, 64)
        << "; expected an integer id from 0, below " << most << " (twice the " << vocab.size()
        << " tokens, plus 1,024)";
    const size_t i = static_cast<size_t>(id.get<int64_t>());
    if (i >= tokens.size()) tokens.resize(i + 1), taken.resize(i + 1, 0);
    TESSEL_CHECK(!taken[i]) << "vocabulary " << where << ": id " << i << " is given to '"
                            << tokens[i].substr(0, 64) << "' and to '" << token.substr(0, 64) << "'";
    taken[i] = 1;
    tokens[i] = token;
  }
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

std::vector<std::string> ReadVocabulary(const std::filesystem::path& file) {
  TESSEL_CHECK(std::filesystem::is_regular_file(file))
      << "vocabulary " << file.string() << " is not a file; expected a vocab.json or vocab.txt";
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(file, error);
  TESSEL_CHECK(!error) << "vocabulary " << file.string() << " cannot be read (" << error.message() << ")";
  TESSEL_CHECK(size <= kMaxVocabularyFileBytes)
      << "vocabulary " << file.string() << " is " << size << " bytes; expected at most " << kMaxVocabularyFileBytes;
  std::ifstream in(file, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TESSEL_CHECK(in.good() || in.eof()) << "vocabulary " << file.string() << ": reading failed";
  return file.extension() == ".json" ? ParseVocabJson(text, file.string()) : ParseVocabTxt(text, file.string());
}

}  // namespace tessel::zoo
