#include "zoo/config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/stubs/strutil.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/join.h"
#include "zoo/foreign_settings.h"
#include "zoo/vocabulary.h"

namespace tessel::zoo {

namespace pb = google::protobuf;

namespace {

// "train.dist" for tessel.config.DistConfig: where each message type sits in
// a config, for error messages (each type appears once).
std::map<std::string, std::string> MessagePaths() {
  std::map<std::string, std::string> paths;
  std::function<void(const pb::Descriptor*, const std::string&)> walk = [&](const pb::Descriptor* d,
                                                                            const std::string& path) {
    paths.emplace(d->full_name(), path.empty() ? "the top level" : path);
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (f->type() == pb::FieldDescriptor::TYPE_MESSAGE)
        walk(f->message_type(), path.empty() ? f->name() : path + "." + f->name());
    }
  };
  walk(config::Config::descriptor(), "");
  return paths;
}

std::vector<std::string> FieldNames(const pb::Descriptor* d) {
  std::vector<std::string> names;
  for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
  return names;
}

// "unknown field 'x' in train.dist; did you mean 'y'?" (or the fields there).
std::string UnknownFieldText(const std::string& field, const pb::Descriptor* d, const std::string& where) {
  std::ostringstream out;
  out << "unknown field '" << field << "' in " << where;
  const std::vector<std::string> names = FieldNames(d);
  const std::string closest = ClosestName(field, names);
  const std::string foreign = ForeignSettingInstead(field);
  if (!foreign.empty()) {
    std::string dashed = field;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    out << "; that is another trainer's setting (Megatron-LM's --" << dashed << "), here: " << foreign;
  } else if (!closest.empty()) {
    out << "; did you mean '" << closest << "'?";
  } else {
    out << "; its fields are " << Join(names);
  }
  return out.str();
}

// Collects the text-format parser's errors, turning "no field named" into
// the unknown-field text above.
class ConfigErrors : public pb::io::ErrorCollector {
 public:
  explicit ConfigErrors(std::string source) : source_(std::move(source)) {}
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    static const std::regex kUnknown(R"re(Message type "([^"]+)" has no field named "([^"]+)")re");
    std::smatch m;
    std::string text = message;
    if (std::regex_search(message, m, kUnknown)) {
      const pb::Descriptor* d = pb::DescriptorPool::generated_pool()->FindMessageTypeByName(m[1].str());
      static const std::map<std::string, std::string> kPaths = MessagePaths();
      auto path = kPaths.find(m[1].str());
      if (d != nullptr && path != kPaths.end()) text = UnknownFieldText(m[2].str(), d, path->second);
    }
    if (first_.empty())
      first_ = source_ + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + text;
  }
  const std::string& first() const { return first_; }

 private:
  std::string source_;
  std::string first_;
};

// Sets every singular field that is not set to its default, recursively,
// so the saved config shows every value the job used.
void FillDefaults(pb::Message* message) {
  const pb::Descriptor* d = message->GetDescriptor();
  const pb::Reflection* r = message->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        FillDefaults(r->MutableMessage(message, f));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        if (!r->HasField(*message, f)) r->SetInt64(message, f, f->default_value_int64());
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        if (!r->HasField(*message, f)) r->SetUInt64(message, f, f->default_value_uint64());
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        if (!r->HasField(*message, f)) r->SetDouble(message, f, f->default_value_double());
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        if (!r->HasField(*message, f)) r->SetBool(message, f, f->default_value_bool());
        break;
      case pb::FieldDescriptor::CPPTYPE_STRING:
        if (!r->HasField(*message, f)) r->SetString(message, f, f->default_value_string());
        break;
      default:
        TESSEL_THROW(StatusCode::kInternal) << "config: field " << f->full_name() << " has a type the "
                                            << "config reader does not fill in";
    }
  }
}

void CheckOneOf(const std::string& field, const std::string& value, const std::vector<std::string>& allowed) {
  TESSEL_CHECK(std::find(allowed.begin(), allowed.end(), value) != allowed.end())
      << "config: " << field << " is '" << value << "'; expected one of " << Join(allowed);
}

void CheckPositive(const std::string& field, int64_t value) {
  TESSEL_CHECK(value >= 1) << "config: " << field << " is " << value << "; expected 1 or more";
}

// A size or count from 1 to `max`: past it, sizes computed from it would
// overflow or ask for memory no machine has.
void CheckSize(const std::string& field, int64_t value, int64_t max) {
  TESSEL_CHECK(value >= 1 && value <= max)
      << "config: " << field << " is " << value << "; expected 1 to " << max;
}

// A finite number in [low, high] (open at either end where said).
void CheckNumber(const std::string& field, double value, double low, double high, bool low_open = false,
                 bool high_open = false) {
  const bool in = std::isfinite(value) && (low_open ? value > low : value >= low) &&
                  (high_open ? value < high : value <= high);
  TESSEL_CHECK(in) << "config: " << field << " is " << value << "; expected a finite number "
                   << (low_open ? "above " : "from ") << low << (high_open ? " and below " : " to ") << high;
}

constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden and per-head sizes
constexpr int64_t kMaxTable = int64_t{1} << 27;  // vocabulary, ffn, positions, classes
constexpr int64_t kMaxCount = int64_t{1} << 31;  // batch sizes, iterations, periods
// Elements of one micro-batch's widest activation on a rank (the logits,
// the MLP's hidden states): beyond this no device holds them.
constexpr double kMaxActivationElements = 1ULL << 40;

// Batch sizes: any two of micro, global and accumulation give the third,
// global = micro x dp x accumulation.
// `dp`: the ranks that read rows of their own (data_parallel_size, or 1
// when the data-parallel ranks split sequences and share every row), named
// `dp_name` in messages.
void ResolveBatchSizes(config::TrainConfig* t, int64_t dp, const std::string& dp_name) {
  const bool has_micro = t->has_micro_batch_size(), has_global = t->has_global_batch_size(),
             has_acc = t->has_num_accumulation_steps();
  if (has_micro) CheckSize("train.micro_batch_size", t->micro_batch_size(), kMaxCount);
  if (has_global) CheckSize("train.global_batch_size", t->global_batch_size(), kMaxCount);
  if (has_acc) CheckSize("train.num_accumulation_steps", t->num_accumulation_steps(), kMaxCount);
  if (has_micro && has_acc) {  // their product with dp is the global batch: within bounds too
    const __int128 global = static_cast<__int128>(t->micro_batch_size()) * dp * t->num_accumulation_steps();
    TESSEL_CHECK(global <= kMaxCount) << "config: train.micro_batch_size x " << dp_name
                                      << " x num_accumulation_steps = " << t->micro_batch_size() << " x "
                                      << dp << " x " << t->num_accumulation_steps() << " is above "
                                      << kMaxCount << "; expected a global batch of at most that";
  }
  if (!has_micro && !has_global) t->set_micro_batch_size(8);
  if (!has_acc && !(has_micro && has_global)) t->set_num_accumulation_steps(1);
  if (!t->has_micro_batch_size()) {  // global and accumulation given
    const int64_t per_micro = dp * t->num_accumulation_steps();
    TESSEL_CHECK(t->global_batch_size() % per_micro == 0)
        << "config: train.global_batch_size " << t->global_batch_size() << " is not divisible by " << dp_name
        << " x num_accumulation_steps = " << dp << " x " << t->num_accumulation_steps() << " = " << per_micro
        << "; expected global = micro x " << dp_name << " x accumulation";
    t->set_micro_batch_size(t->global_batch_size() / per_micro);
  } else if (!t->has_num_accumulation_steps()) {  // micro and global given
    const int64_t per_step = t->micro_batch_size() * dp;
    TESSEL_CHECK(t->global_batch_size() % per_step == 0)
        << "config: train.global_batch_size " << t->global_batch_size()
        << " is not divisible by micro_batch_size x " << dp_name << " = " << t->micro_batch_size() << " x "
        << dp << " = " << per_step << "; expected global = micro x " << dp_name << " x accumulation";
    t->set_num_accumulation_steps(t->global_batch_size() / per_step);
  }
  const int64_t global = t->micro_batch_size() * dp * t->num_accumulation_steps();
  if (!t->has_global_batch_size()) t->set_global_batch_size(global);
  TESSEL_CHECK(t->global_batch_size() == global)
      << "config: train.global_batch_size is " << t->global_batch_size() << " but micro_batch_size x "
      << dp_name << " x num_accumulation_steps = " << t->micro_batch_size() << " x " << dp << " x "
      << t->num_accumulation_steps() << " = " << global << "; set two of the three and the third follows";
}

}  // namespace

std::string ClosestName(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;  // farther is not a typo
  std::vector<size_t> row;
  for (const std::string& c : candidates) {
    // The distance is at least the difference in length: such a candidate
    // is skipped unread (a long mistyped name costs nothing per candidate).
    const size_t longer = std::max(name.size(), c.size()), shorter = std::min(name.size(), c.size());
    if (longer - shorter >= best_distance) continue;
    // Levenshtein distance, one row at a time; a row whose every entry is
    // already too far ends the candidate.
    row.resize(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) row[j] = j;
    bool too_far = false;
    for (size_t i = 1; i <= name.size() && !too_far; ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      size_t row_min = row[0];
      for (size_t j = 1; j <= c.size(); ++j) {
        const size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (name[i - 1] == c[j - 1] ? 0 : 1)});
        diagonal = above;
        row_min = std::min(row_min, row[j]);
      }
      too_far = row_min >= best_distance;
    }
    if (!too_far && row[c.size()] < best_distance) {
      best_distance = row[c.size()];
      best = c;
    }
  }
  return best;
}

config::Config ParseConfig(const std::string& text, const std::string& source) {
  TESSEL_CHECK(text.size() <= kMaxConfigBytes)
      << "config " << source << ": " << text.size() << " bytes; a config is at most " << kMaxConfigBytes;
  config::Config config;
  ConfigErrors errors(source);
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "config " << (errors.first().empty() ? source + ": not a valid config" : errors.first());
  }
  return config;
}

namespace {

void OverrideMessage(pb::Message* base, const pb::Message& over) {
  const pb::Reflection* r = over.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(over, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    if (!f->is_repeated() && f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      OverrideMessage(base->GetReflection()->MutableMessage(base, f), r->GetMessage(over, f));
    } else {
      base->GetReflection()->ClearField(base, f);  // a list is replaced whole
    }
  }
  // What is left to copy: lists and plain fields, onto cleared ones.
  std::unique_ptr<pb::Message> rest(over.New());
  rest->CopyFrom(over);
  for (const pb::FieldDescriptor* f : fields)
    if (!f->is_repeated() && f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE)
      rest->GetReflection()->ClearField(rest.get(), f);
  base->MergeFrom(*rest);
}

constexpr int kMaxIncludeDepth = 16;
constexpr int kMaxIncludedFiles = 256;  // a file included twice counts twice: no exponential fan-out

struct IncludeState {
  std::vector<std::filesystem::path> chain;  // the files including the one being read
  int files = 0;
};

config::Config LoadConfigFile(const std::filesystem::path& path, IncludeState& state) {
  std::vector<std::filesystem::path>& chain = state.chain;
  TESSEL_CHECK(++state.files <= kMaxIncludedFiles)
      << "config " << path.string() << ": more than " << kMaxIncludedFiles
      << " files read through includes; expected a handful of bases";
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  TESSEL_CHECK(!error) << "config " << path.string() << ": cannot read it (" << error.message() << ")"
                       << (chain.empty() ? "" : "; included by " + chain.back().string());
  TESSEL_CHECK(size <= kMaxConfigBytes)
      << "config " << path.string() << ": " << size << " bytes; a config is at most " << kMaxConfigBytes;
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TESSEL_CHECK(in.good() || in.eof()) << "config " << path.string() << ": read failed";
  config::Config config = ParseConfig(text, path.string());
  // Paths are relative to the file that gives them.
  auto relative_to_config = [&](const std::string& p) {
    return (path.parent_path() / p).lexically_normal().string();
  };
  const config::DataConfig& data = config.data();
  if (!data.data_prefix().empty() && std::filesystem::path(data.data_prefix()).is_relative())
    config.mutable_data()->set_data_prefix(relative_to_config(data.data_prefix()));
  for (config::WeightedDataset& part : *config.mutable_data()->mutable_blend())
    if (!part.data_prefix().empty() && std::filesystem::path(part.data_prefix()).is_relative())
      part.set_data_prefix(relative_to_config(part.data_prefix()));
  if (!data.image_dataset().empty() && data.image_dataset() != "synthetic" &&
      std::filesystem::path(data.image_dataset()).is_relative())
    config.mutable_data()->set_image_dataset(relative_to_config(data.image_dataset()));
  if (!data.vocab_file().empty() && std::filesystem::path(data.vocab_file()).is_relative())
    config.mutable_data()->set_vocab_file(relative_to_config(data.vocab_file()));
  const std::string& weights = config.train().load_weight();
  if (!weights.empty() && std::filesystem::path(weights).is_relative())
    config.mutable_train()->set_load_weight(relative_to_config(weights));
  if (config.include_size() == 0) return config;

  const std::filesystem::path canonical = std::filesystem::weakly_canonical(path);
  for (const std::filesystem::path& outer : chain)
    TESSEL_CHECK(outer != canonical) << "config " << path.string() << " includes itself (through " << [&] {
      std::string names;
      for (const auto& p : chain) names += p.string() + " -> ";
      return names + canonical.string();
    }() << ")";
  TESSEL_CHECK(static_cast<int>(chain.size()) < kMaxIncludeDepth)
      << "config " << path.string() << ": includes nest more than " << kMaxIncludeDepth << " deep";
  chain.push_back(canonical);
  config::Config merged;
  for (const std::string& include : config.include()) {
    TESSEL_CHECK(!include.empty()) << "config " << path.string() << ": an include is empty; expected a file";
    const std::filesystem::path base = std::filesystem::path(include).is_relative()
                                           ? (path.parent_path() / include).lexically_normal()
                                           : std::filesystem::path(include);
    OverrideConfig(&merged, LoadConfigFile(base, state));
  }
  chain.pop_back();
  config.clear_include();
  OverrideConfig(&merged, config);
  return merged;
}

}  // namespace

void OverrideConfig(config::Config* base, const config::Config& over) { OverrideMessage(base, over); }

config::Config LoadConfig(const std::string& path) {
  IncludeState state;
  return LoadConfigFile(path, state);
}

namespace {

// Applies one override; a repeated field is cleared first only when
// `replace_repeated` (a list given once replaces the config's, a second
// --set of the same list adds to it).
void ApplyOneOverride(config::Config* config, const std::string& assignment, bool replace_repeated) {
  const size_t eq = assignment.find('=');
  TESSEL_CHECK(eq != std::string::npos && eq > 0)
      << "--set '" << assignment << "': expected path.to.field=value, e.g. train.dist.tensor_parallel_size=2";
  const std::string path = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  pb::Message* message = config;
  std::string where;
  std::stringstream parts(path);
  std::string name;
  std::vector<std::string> names;
  while (std::getline(parts, name, '.')) names.push_back(name);
  for (size_t i = 0; i < names.size(); ++i) {
    const pb::Descriptor* d = message->GetDescriptor();
    const pb::FieldDescriptor* f = d->FindFieldByName(names[i]);
    TESSEL_CHECK(f != nullptr) << "--set '" << assignment << "': "
                               << UnknownFieldText(names[i], d, where.empty() ? "the top level" : where);
    where = where.empty() ? names[i] : where + "." + names[i];
    const bool last = i + 1 == names.size();
    if (!last) {
      TESSEL_CHECK(f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated())
          << "--set '" << assignment << "': " << where << " is a value, not a section";
      message = message->GetReflection()->MutableMessage(message, f);
      continue;
    }
    if (!f->is_repeated() || replace_repeated) message->GetReflection()->ClearField(message, f);
    std::string literal = value;
    // Strings may be given bare: --set data.data_prefix=/data/corpus.
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && !f->is_repeated() &&
        (value.empty() || value.front() != '"'))
      literal = std::string("\"").append(pb::CEscape(value)).append("\"");
    ConfigErrors errors(std::string("--set '").append(assignment).append("'"));
    pb::TextFormat::Parser parser;
    parser.RecordErrorsTo(&errors);
    TESSEL_CHECK(parser.MergeFromString(f->name() + ": " + literal, message))
        << "--set '" << assignment << "': '" << value << "' is not a value of " << where << " ("
        << f->type_name() << "): " << errors.first();
  }
}

}  // namespace

void ApplyOverride(config::Config* config, const std::string& assignment) {
  ApplyOneOverride(config, assignment, /*replace_repeated=*/true);
}

void ApplyOverrides(config::Config* config, const std::vector<std::string>& assignments) {
  std::set<std::string> paths;  // set once already in this list
  for (const std::string& assignment : assignments) {
    const std::string path = assignment.substr(0, assignment.find('='));
    ApplyOneOverride(config, assignment, /*replace_repeated=*/paths.insert(path).second);
  }
}

namespace {
// Llama's own fields: key/value heads that divide the query heads, even
// head dimensions for the rotation, a valid Llama 3 scaling.
void ResolveLlama(config::ModelConfig* m) {
  CheckSize("model.num_attention_heads", m->num_attention_heads(), kMaxWidth);
  TESSEL_CHECK(m->num_key_value_heads() >= 0 && m->num_key_value_heads() <= m->num_attention_heads())
      << "config: model.num_key_value_heads is " << m->num_key_value_heads()
      << "; expected 0 (num_attention_heads) "
      << "to num_attention_heads (" << m->num_attention_heads() << ")";
  if (m->num_key_value_heads() == 0) m->set_num_key_value_heads(m->num_attention_heads());
  TESSEL_CHECK(m->num_attention_heads() % m->num_key_value_heads() == 0)
      << "config: model.num_attention_heads " << m->num_attention_heads()
      << " is not divisible by model.num_key_value_heads " << m->num_key_value_heads();
  TESSEL_CHECK(m->hidden_size() % m->num_attention_heads() == 0 &&
               (m->hidden_size() / m->num_attention_heads()) % 2 == 0)
      << "config: model.hidden_size " << m->hidden_size() << " / num_attention_heads "
      << m->num_attention_heads()
      << " must be a whole, even head dimension (rotary embeddings turn pairs of features)";
  for (const auto& [field, p] :
       {std::pair<const char*, double>{"embedding_dropout_prob", m->embedding_dropout_prob()},
        {"attention_dropout_prob", m->attention_dropout_prob()},
        {"hidden_dropout_prob", m->hidden_dropout_prob()}})
    TESSEL_CHECK(p == 0)
        << "config: model." << field << " is " << p
        << " but tessel's Llama has no dropout (as Meta's and Hugging Face's train it); leave it out";
  CheckNumber("model.rope_theta", m->rope_theta(), 1, 1e12, /*low_open=*/false);
  const config::RopeScaling& r = m->rope_scaling();
  CheckOneOf("model.rope_scaling.rope_type", r.rope_type(), {"", "llama3"});
  if (r.rope_type().empty()) return;
  CheckNumber("model.rope_scaling.factor", r.factor(), 1, 1e6, /*low_open=*/false);
  TESSEL_CHECK(r.low_freq_factor() > 0 && r.high_freq_factor() > r.low_freq_factor() &&
               std::isfinite(r.high_freq_factor()))
      << "config: model.rope_scaling low_freq_factor " << r.low_freq_factor() << " and high_freq_factor "
      << r.high_freq_factor() << "; expected 0 < low < high";
  CheckSize("model.rope_scaling.original_max_position_embeddings", r.original_max_position_embeddings(),
            kMaxTable);
}

// BERT's sample options against the model: probabilities in range, the
// special tokens distinct ids of the vocabulary, room for [CLS] A [SEP] B [SEP].
// data.vocab_file: the model's vocabulary size and BERT's special tokens
// from the tokenizer's own file, where the config leaves them out; checked
// against it where the config gives them.
void ApplyVocabularyFile(config::Config* c) {
  config::DataConfig& data = *c->mutable_data();
  if (data.vocab_file().empty()) return;
  config::ModelConfig& m = *c->mutable_model();
  TESSEL_CHECK(m.arch() != "vit")
      << "config: data.vocab_file is set for model.arch vit, which reads no tokens";
  const std::vector<std::string> tokens = ReadVocabulary(data.vocab_file());
  const int64_t count = static_cast<int64_t>(tokens.size());
  if (!m.has_vocab_size()) m.set_vocab_size(count);
  TESSEL_CHECK(m.vocab_size() >= count)
      << "config: model.vocab_size is " << m.vocab_size() << " but data.vocab_file " << data.vocab_file()
      << " holds " << count << " tokens; leave model.vocab_size out to take the file's count";
  if (m.arch() == "t5" && data.eos_token_id() == -1) {
    // The end-of-sequence token of T5's SentencePiece, of GPT-2's and of
    // Llama 3's vocabularies; else T5's id, 1, below.
    for (const char* eos : {"</s>", "<|endoftext|>", "<|end_of_text|>"}) {
      const auto found = std::find(tokens.begin(), tokens.end(), eos);
      if (found == tokens.end()) continue;
      data.set_eos_token_id(found - tokens.begin());
      break;
    }
  }
  if (m.arch() != "bert") return;
  struct Special {
    const char* field;
    const char* token;
    bool given;
    int64_t id;
    void (config::DataConfig::*set)(int64_t);
  };
  for (const Special& s : {Special{"cls_token_id", "[CLS]", data.has_cls_token_id(), data.cls_token_id(),
                                   &config::DataConfig::set_cls_token_id},
                           Special{"sep_token_id", "[SEP]", data.has_sep_token_id(), data.sep_token_id(),
                                   &config::DataConfig::set_sep_token_id},
                           Special{"mask_token_id", "[MASK]", data.has_mask_token_id(), data.mask_token_id(),
                                   &config::DataConfig::set_mask_token_id},
                           Special{"pad_token_id", "[PAD]", data.has_pad_token_id(), data.pad_token_id(),
                                   &config::DataConfig::set_pad_token_id}}) {
    if (s.given) {
      TESSEL_CHECK(s.id >= 0 && s.id < count && tokens[static_cast<size_t>(s.id)] == s.token)
          << "config: data." << s.field << " is " << s.id << " but " << s.token << " is "
          << (std::find(tokens.begin(), tokens.end(), s.token) == tokens.end()
                  ? std::string("not in ")
                  : "id " +
                        std::to_string(std::find(tokens.begin(), tokens.end(), s.token) - tokens.begin()) +
                        " in ")
          << data.vocab_file() << "; leave data." << s.field << " out to take the file's";
      continue;
    }
    const auto found = std::find(tokens.begin(), tokens.end(), s.token);
    TESSEL_CHECK(found != tokens.end()) << "config: data.vocab_file " << data.vocab_file() << " has no "
                                        << s.token << " token; set data." << s.field;
    (data.*s.set)(found - tokens.begin());
  }
  if (!m.has_pad_token_id()) m.set_pad_token_id(data.pad_token_id());
}

// T5's own fields: decoder layers, the head width, the relative buckets;
// its feed-forward; no dropout (tessel's T5 has none).
void ResolveT5(config::ModelConfig* m) {
  if (!m->has_hidden_act()) m->set_hidden_act("gated-gelu");
  CheckOneOf("model.hidden_act", m->hidden_act(), {"gated-gelu", "relu"});
  if (!m->has_layernorm_epsilon()) m->set_layernorm_epsilon(1e-6);
  TESSEL_CHECK(m->num_decoder_layers() >= 0 && m->num_decoder_layers() <= (1 << 16))
      << "config: model.num_decoder_layers is " << m->num_decoder_layers()
      << "; expected 0 (hidden_layers) to " << (1 << 16);
  if (m->num_decoder_layers() == 0) m->set_num_decoder_layers(m->hidden_layers());
  TESSEL_CHECK(m->head_dim() >= 0 && m->head_dim() <= kMaxWidth)
      << "config: model.head_dim is " << m->head_dim()
      << "; expected 0 (hidden_size / num_attention_heads) to " << kMaxWidth;
  if (m->head_dim() == 0) {
    TESSEL_CHECK(m->num_attention_heads() > 0 && m->hidden_size() % m->num_attention_heads() == 0)
        << "config: model.hidden_size " << m->hidden_size()
        << " is not divisible by model.num_attention_heads " << m->num_attention_heads()
        << "; give model.head_dim";
    m->set_head_dim(m->hidden_size() / m->num_attention_heads());
  }
  CheckSize("model.relative_attention_num_buckets", m->relative_attention_num_buckets(), kMaxTable);
  CheckSize("model.relative_attention_max_distance", m->relative_attention_max_distance(), kMaxTable);
  TESSEL_CHECK(m->relative_attention_num_buckets() >= 4 &&
               m->relative_attention_max_distance() > m->relative_attention_num_buckets() / 4)
      << "config: model.relative_attention_num_buckets " << m->relative_attention_num_buckets()
      << " and relative_attention_max_distance " << m->relative_attention_max_distance()
      << "; expected at least 4 buckets and a distance beyond the exact ones (num_buckets / 4)";
  for (const auto& [field, p] :
       {std::pair<const char*, double>{"embedding_dropout_prob", m->embedding_dropout_prob()},
        {"attention_dropout_prob", m->attention_dropout_prob()},
        {"hidden_dropout_prob", m->hidden_dropout_prob()}})
    TESSEL_CHECK(p == 0) << "config: model." << field << " is " << p
                         << " but tessel's T5 has no dropout yet; leave it out";
}

// Span corruption's options against the model: the sentinels above every
// ordinary id; the corpus's own ids are checked by the task.
void CheckT5Data(config::Config* c) {
  config::DataConfig& data = *c->mutable_data();
  const config::ModelConfig& m = c->model();
  CheckNumber("data.noise_density", data.noise_density(), 0, 1, /*low_open=*/true, /*high_open=*/true);
  CheckNumber("data.mean_noise_span_length", data.mean_noise_span_length(), 1, 1e6);
  if (data.eos_token_id() == -1) data.set_eos_token_id(1);
  TESSEL_CHECK(data.eos_token_id() >= 0 && data.eos_token_id() < m.vocab_size())
      << "config: data.eos_token_id is " << data.eos_token_id() << "; expected an id below model.vocab_size "
      << m.vocab_size();
  TESSEL_CHECK(m.max_seq_length() >= 3) << "config: model.max_seq_length is " << m.max_seq_length()
                                        << "; T5's encoder input needs at least 3 (a token, a sentinel, eos)";
}

void CheckBertData(const config::Config& c) {
  const config::DataConfig& data = c.data();
  const config::ModelConfig& m = c.model();
  TESSEL_CHECK(data.masked_lm_prob() > 0 && data.masked_lm_prob() < 1)
      << "config: data.masked_lm_prob is " << data.masked_lm_prob() << "; expected 0 < p < 1";
  TESSEL_CHECK(data.short_seq_prob() >= 0 && data.short_seq_prob() <= 1)
      << "config: data.short_seq_prob is " << data.short_seq_prob() << "; expected 0 <= p <= 1";
  TESSEL_CHECK(m.max_seq_length() >= 5) << "config: model.max_seq_length is " << m.max_seq_length()
                                        << "; BERT needs at least 5 ([CLS] A [SEP] B [SEP])";
  TESSEL_CHECK(m.type_vocab_size() >= 2)
      << "config: model.type_vocab_size is " << m.type_vocab_size() << "; BERT's pairs need at least 2";
  const std::pair<const char*, int64_t> ids[] = {{"cls_token_id", data.cls_token_id()},
                                                 {"sep_token_id", data.sep_token_id()},
                                                 {"mask_token_id", data.mask_token_id()},
                                                 {"pad_token_id", data.pad_token_id()}};
  for (const auto& [field, id] : ids)
    TESSEL_CHECK(id >= 0 && id < m.vocab_size())
        << "config: data." << field << " is " << id << "; expected an id below model.vocab_size "
        << m.vocab_size();
  for (size_t i = 0; i < 4; ++i)
    for (size_t j = i + 1; j < 4; ++j)
      TESSEL_CHECK(ids[i].second != ids[j].second)
          << "config: data." << ids[i].first << " and data." << ids[j].first << " are both " << ids[i].second
          << "; expected distinct special tokens";
  TESSEL_CHECK(m.pad_token_id() == -1 || m.pad_token_id() == data.pad_token_id())
      << "config: model.pad_token_id is " << m.pad_token_id() << " and data.pad_token_id "
      << data.pad_token_id()
      << "; the embedding's padding row must be the data's padding token (or -1: none)";
}
}  // namespace

double MaxDurationSeconds(const config::TrainConfig& train) {
  const std::string& text = train.max_duration();
  if (text.empty()) return 0;
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  double unit = -1;
  if (ec == std::errc() && ptr + 1 >= end) {
    const char suffix = ptr == end ? 's' : *ptr;
    unit = suffix == 's' ? 1 : suffix == 'm' ? 60 : suffix == 'h' ? 3600 : suffix == 'd' ? 86400 : -1;
  }
  // Up to ten years: beyond that the budget is a typo, not a limit.
  TESSEL_CHECK(unit > 0 && std::isfinite(value) && value > 0 && value * unit <= 10 * 365 * 86400.0)
      << "config: train.max_duration is '" << text
      << "'; expected a positive duration such as \"90s\", \"45m\", \"12h\", \"2d\" or a number of seconds "
         "(\"\" for no limit)";
  return value * unit;
}

void ResolveConfig(config::Config* c, int world_size, const std::vector<std::string>& other_models) {
  config::ModelConfig& m = *c->mutable_model();
  config::TrainConfig& t = *c->mutable_train();
  config::DistConfig& d = *t.mutable_dist();
  const std::vector<std::string> zoo = {"gpt2", "gpt", "llama", "t5", "bert", "vit"};
  // A model the program registered: its factory checks the model section
  // (the typed fields it reads, model.options) and its data.
  const bool own = std::find(zoo.begin(), zoo.end(), m.arch()) == zoo.end() &&
                   std::find(other_models.begin(), other_models.end(), m.arch()) != other_models.end();
  if (!own) {
    std::vector<std::string> known = zoo;
    for (const std::string& name : other_models)
      if (std::find(zoo.begin(), zoo.end(), name) == zoo.end()) known.push_back(name);
    CheckOneOf("model.arch", m.arch(), known);
  }
  m.set_arch(CanonicalArch(m.arch()));
  const bool vision = m.arch() == "vit", llama = m.arch() == "llama", t5 = m.arch() == "t5";
  TESSEL_CHECK(own || m.options().empty())
      << "config: model.options holds '" << m.options().begin()->first << "', but model.arch '" << m.arch()
      << "' is of the zoo, which takes its settings from the typed fields; model.options is for a model the "
         "program registered (train::RegisterModel)";
  ApplyVocabularyFile(c);
  if (own) {
    // hidden_act and the other models' settings are the registered model's to read.
  } else if (llama) {
    if (!m.has_hidden_act()) m.set_hidden_act("silu");
    CheckOneOf("model.hidden_act", m.hidden_act(), {"silu"});
    ResolveLlama(&m);
  } else if (t5) {
    ResolveT5(&m);
  } else {
    CheckOneOf("model.hidden_act", m.hidden_act(), {"gelu_tanh", "gelu"});
  }
  // Another model's settings. Compared with the defaults, not by presence:
  // a resolved config (saved with every field) is read again on resume.
  struct Foreign {
    const char* field;
    bool set;
    bool allowed;
    const char* owner;
  };
  for (const Foreign& f :
       own ? std::vector<Foreign>{}
           : std::vector<Foreign>{
                 Foreign{"num_key_value_heads", m.num_key_value_heads() != 0, llama, "a Llama"},
                 {"rope_theta", m.rope_theta() != 10000, llama, "a Llama"},
                 {"rope_scaling.rope_type", !m.rope_scaling().rope_type().empty(), llama, "a Llama"},
                 {"tie_word_embeddings", m.tie_word_embeddings(), llama || t5, "a Llama and T5"},
                 {"num_decoder_layers", m.num_decoder_layers() != 0, t5, "a T5"},
                 {"head_dim", m.head_dim() != 0, t5, "a T5"},
                 {"relative_attention_num_buckets", m.relative_attention_num_buckets() != 32, t5, "a T5"},
                 {"relative_attention_max_distance", m.relative_attention_max_distance() != 128, t5, "a T5"}})
    TESSEL_CHECK(f.allowed || !f.set) << "config: model." << f.field << " is " << f.owner
                                      << " setting, but model.arch is '" << m.arch() << "'; leave it out";
  for (const auto& [field, p] :
       {std::pair<const char*, double>{"embedding_dropout_prob", m.embedding_dropout_prob()},
        {"attention_dropout_prob", m.attention_dropout_prob()},
        {"hidden_dropout_prob", m.hidden_dropout_prob()}})
    TESSEL_CHECK(p >= 0 && p < 1) << "config: model." << field << " is " << p << "; expected 0 <= p < 1";
  CheckSize("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by(), kMaxWidth);
  CheckSize("model.hidden_layers", m.hidden_layers(), 1 << 16);
  CheckSize("model.hidden_size", m.hidden_size(), kMaxWidth);
  CheckSize("model.num_attention_heads", m.num_attention_heads(), kMaxWidth);
  CheckSize("model.vocab_size", m.vocab_size(), kMaxTable);
  CheckSize("model.max_seq_length", m.max_seq_length(), kMaxTable);
  CheckSize("model.type_vocab_size", m.type_vocab_size(), kMaxTable);
  if (vision) {
    CheckSize("model.image_size", m.image_size(), 1 << 16);
    CheckSize("model.patch_size", m.patch_size(), 1 << 16);
    CheckSize("model.num_channels", m.num_channels(), 1 << 16);
    TESSEL_CHECK(m.num_classes() <= kMaxTable)
        << "config: model.num_classes is " << m.num_classes() << "; expected at most " << kMaxTable;
    TESSEL_CHECK(m.image_size() % m.patch_size() == 0)
        << "config: model.image_size " << m.image_size() << " is not a multiple of model.patch_size "
        << m.patch_size() << "; expected whole patches";
    TESSEL_CHECK(m.num_classes() >= 0)
        << "config: model.num_classes is " << m.num_classes() << "; expected 0 (the dataset's count) or more";
  }
  TESSEL_CHECK(m.ffn_hidden_size() >= 0 && m.ffn_hidden_size() <= kMaxTable)
      << "config: model.ffn_hidden_size is " << m.ffn_hidden_size() << "; expected 0 (4 x hidden_size) to "
      << kMaxTable;
  if (m.ffn_hidden_size() == 0)
    m.set_ffn_hidden_size(llama ? (2 * (4 * m.hidden_size()) / 3 + 255) / 256 * 256 : 4 * m.hidden_size());
  TESSEL_CHECK(m.max_position_embeddings() >= 0 && m.max_position_embeddings() <= kMaxTable)
      << "config: model.max_position_embeddings is " << m.max_position_embeddings()
      << "; expected 0 (max_seq_length) to " << kMaxTable;
  if (m.max_position_embeddings() == 0) m.set_max_position_embeddings(m.max_seq_length());
  TESSEL_CHECK(vision || m.max_position_embeddings() >= m.max_seq_length())
      << "config: model.max_position_embeddings " << m.max_position_embeddings()
      << " is below model.max_seq_length " << m.max_seq_length() << "; expected a position for every token";
  CheckNumber("model.layernorm_epsilon", m.layernorm_epsilon(), 0, 1, /*low_open=*/true);
  CheckNumber("model.initializer_range", m.initializer_range(), 0, 1e3, /*low_open=*/true);
  // T5's heads have a width of their own (model.head_dim).
  TESSEL_CHECK(t5 || own || m.hidden_size() % m.num_attention_heads() == 0)
      << "config: model.hidden_size " << m.hidden_size() << " is not divisible by model.num_attention_heads "
      << m.num_attention_heads();

  CheckOneOf("train.dist.device", d.device(), {"cpu", "cuda"});
  CheckOneOf("train.dist.sequence_parallel_mode", d.sequence_parallel_mode(),
             {"megatron", "all_to_all", "context"});
  // A mode chosen for sequence parallelism left off would train without it.
  TESSEL_CHECK(d.sequence_parallel() || d.sequence_parallel_mode() == "megatron")
      << "config: train.dist.sequence_parallel_mode is '" << d.sequence_parallel_mode()
      << "' but train.dist.sequence_parallel is false; set sequence_parallel: true to use it";
  // The ranks share the rows and split the tokens; values per row and
  // images are every rank's. Llama (rotary positions) and T5 (two
  // sequences) have not been made to follow; a registered model's layers
  // are its own to check.
  TESSEL_CHECK(!SequencesSplitOverDataParallel(d) || m.arch() == "gpt2" || m.arch() == "bert" || vision || own)
      << "config: train.dist.sequence_parallel_mode " << d.sequence_parallel_mode()
      << " is for model.arch gpt2, bert and vit; this config trains '" << m.arch() << "'";
  if (t.amp().enabled()) {
    const config::AmpConfig& amp = t.amp();
    CheckOneOf("train.amp.dtype", amp.dtype(), {"bf16", "f16"});
    TESSEL_CHECK(d.device() == "cuda")
        << "config: train.amp computes in " << amp.dtype() << ", which only the CUDA kernels do; set "
        << "train.dist.device: \"cuda\" (the CPU kernels compute in f32)";
    TESSEL_CHECK(amp.initial_loss_scale() >= amp.min_loss_scale() && amp.min_loss_scale() > 0 &&
                 amp.loss_scale_window() > 0)
        << "config: train.amp loss scale: initial_loss_scale " << amp.initial_loss_scale()
        << ", min_loss_scale " << amp.min_loss_scale() << ", loss_scale_window " << amp.loss_scale_window()
        << "; expected initial >= min > 0 and a positive window";
  }
  if (t.zero_optimization().enabled()) {
    TESSEL_CHECK(t.zero_optimization().stage() >= 1 && t.zero_optimization().stage() <= 3)
        << "config: train.zero_optimization.stage is " << t.zero_optimization().stage()
        << "; expected 1 (optimizer state), 2 (and gradients) or 3 (and parameters)";
    TESSEL_CHECK(!t.amp().enabled())
        << "config: train.zero_optimization with train.amp is not supported yet (mixed precision keeps its "
           "own f32 master weights); turn one of them off";
  }
  TESSEL_CHECK(d.device() == "cpu" || !t.graph().enabled())
      << "config: train.dist.device \"cuda\" runs eager only for now (the graph executor allocates on the "
         "host); set train.graph.enabled: false";
  // Each at most the world (before any product of them is taken).
  CheckSize("train.dist.tensor_parallel_size", d.tensor_parallel_size(), world_size);
  CheckSize("train.dist.pipeline_parallel_size", d.pipeline_parallel_size(), world_size);
  if (d.data_parallel_size() != 0)
    CheckSize("train.dist.data_parallel_size", d.data_parallel_size(), world_size);
  CheckSize("train.dist.virtual_pipeline_size", d.virtual_pipeline_size(), 1 << 16);
  const int64_t tp = d.tensor_parallel_size(), pp = d.pipeline_parallel_size();
  if (d.data_parallel_size() == 0) {
    TESSEL_CHECK(world_size % (tp * pp) == 0)
        << "config: " << world_size << " ranks cannot be split into tensor_parallel_size " << tp
        << " x pipeline_parallel_size " << pp << " = " << tp * pp
        << " (data_parallel_size is derived as world / (tensor x pipeline)); launch a multiple of " << tp * pp
        << " ranks";
    d.set_data_parallel_size(world_size / (tp * pp));
  }
  const int64_t dp = d.data_parallel_size();
  CheckPositive("train.dist.data_parallel_size", dp);
  TESSEL_CHECK(dp * tp * pp == world_size)
      << "config: data_parallel_size x tensor_parallel_size x pipeline_parallel_size = " << dp << " x " << tp
      << " x " << pp << " = " << dp * tp * pp << " but the job has " << world_size << " ranks";
  TESSEL_CHECK(!SequencesSplitOverDataParallel(d) || dp > 1)
      << "config: train.dist.sequence_parallel_mode " << d.sequence_parallel_mode()
      << " splits each sequence over the data-parallel "
         "ranks, but data_parallel_size is 1; launch more ranks or use sequence_parallel_mode megatron";
  // 1d (the default, the one mode the zoo knows) splits the heads and the
  // MLP's features over all tp ranks. Other modes are registries the
  // training program holds; their layers name what they split when the
  // model is built, before any work.
  // A registered model's layers name what they cannot split.
  const bool one_d = d.tensor_parallel_mode() == "1d" && !own;
  TESSEL_CHECK(!one_d || m.num_attention_heads() % tp == 0)
      << "config: model.num_attention_heads " << m.num_attention_heads()
      << " is not divisible by train.dist.tensor_parallel_size " << tp;
  TESSEL_CHECK(!llama || m.num_key_value_heads() % tp == 0)
      << "config: model.num_key_value_heads " << m.num_key_value_heads()
      << " is not divisible by train.dist.tensor_parallel_size " << tp
      << " (each rank holds whole key/value heads, as in Megatron-LM)";
  TESSEL_CHECK(!(llama || t5) || one_d)
      << "config: model.arch " << m.arch() << " trains under tensor_parallel_mode 1d only; got '"
      << d.tensor_parallel_mode() << "'";
  TESSEL_CHECK(!t5 || !d.sequence_parallel())
      << "config: train.dist.sequence_parallel is true but model.arch t5 trains without sequence "
         "parallelism so far; leave it out";
  TESSEL_CHECK(!one_d || m.ffn_hidden_size() % tp == 0)
      << "config: model.ffn_hidden_size " << m.ffn_hidden_size()
      << " is not divisible by train.dist.tensor_parallel_size " << tp;
  // The layers the pipeline places: T5's encoder's, then its decoder's.
  const int64_t layers = m.hidden_layers() + (t5 ? m.num_decoder_layers() : 0);
  const std::string layers_field =
      t5 ? "model.hidden_layers + num_decoder_layers" : std::string("model.hidden_layers");
  if (d.pipeline_num_layers() == 0) d.set_pipeline_num_layers(layers);
  TESSEL_CHECK(d.pipeline_num_layers() == layers)
      << "config: train.dist.pipeline_num_layers is " << d.pipeline_num_layers() << " but " << layers_field
      << " is " << layers << "; expected them equal (or pipeline_num_layers left out)";
  TESSEL_CHECK(layers >= pp) << "config: " << layers_field << " " << layers
                             << " is fewer than train.dist.pipeline_parallel_size " << pp
                             << "; every stage needs a layer";
  const int64_t chunks = d.virtual_pipeline_size();
  TESSEL_CHECK(chunks == 1 || (chunks > 1 && pp > 1 && t.graph().enabled()))
      << "config: train.dist.virtual_pipeline_size is " << chunks
      << "; expected 1, or more model chunks per stage of a pipeline (pipeline_parallel_size " << pp
      << ") in graph mode (train.graph.enabled)";
  TESSEL_CHECK(layers >= pp * chunks)
      << "config: " << layers_field << " " << layers << " is fewer than train.dist.pipeline_parallel_size "
      << pp << " x virtual_pipeline_size " << chunks << "; every virtual stage needs a layer";
  TESSEL_CHECK(d.custom_pipeline_stage_id_size() == 0 || d.custom_pipeline_stage_id_size() == layers)
      << "config: train.dist.custom_pipeline_stage_id has " << d.custom_pipeline_stage_id_size()
      << " entries; expected one per layer (" << layers << (t5 ? ": the encoder's and decoder's" : "")
      << ") or none";

  // Under all-to-all sequence parallelism and context parallelism the dp
  // ranks share each micro-batch's rows, each holding its part of every
  // sequence, so they read micro_batch_size rows together.
  if (SequencesSplitOverDataParallel(d))
    ResolveBatchSizes(&t, 1,
                      "1 (the data-parallel ranks share every row under sequence_parallel_mode " +
                          d.sequence_parallel_mode() + ")");
  else
    ResolveBatchSizes(&t, dp, "data_parallel_size");
  TESSEL_CHECK(chunks == 1 || t.graph().pipeline() != "interleaved_1f1b" ||
               t.num_accumulation_steps() % pp == 0)
      << "config: train.num_accumulation_steps is " << t.num_accumulation_steps()
      << "; interleaved_1f1b runs micro-batches in rounds of the " << pp
      << " stages, so expected a multiple of train.dist.pipeline_parallel_size";
  CheckSize("train.train_iter", t.train_iter(), kMaxCount);
  CheckSize("train.log_period", t.log_period(), kMaxCount);
  // Schedules, parallel modes and gradient handlers are registries a
  // training program can add to: it checks their names (and the handlers'
  // options) against them before any work starts.
  TESSEL_CHECK(!t.graph().pipeline().empty()) << "config: train.graph.pipeline is empty; expected a schedule "
                                                 "name such as 1f1b, gpipe or in_order";
  TESSEL_CHECK(!d.tensor_parallel_mode().empty())
      << "config: train.dist.tensor_parallel_mode is empty; expected a parallel mode such as 1d";
  for (int i = 0; i < t.gradient_handler_size(); ++i)
    TESSEL_CHECK(!t.gradient_handler(i).name().empty())
        << "config: train.gradient_handler[" << i << "] has no name; expected e.g. name: \"clip_value\"";
  TESSEL_CHECK(!t.activation_checkpoint() || t.graph().enabled())
      << "config: train.activation_checkpoint is true but train.graph.enabled is false; recomputation runs "
         "in a captured step (graph mode)";
  TESSEL_CHECK(!t.output_dir().empty()) << "config: train.output_dir is empty; expected a directory";
  TESSEL_CHECK(t.save_period() >= 0) << "config: train.save_period is " << t.save_period()
                                     << "; expected 0 (no checkpoints) or a number of iterations";
  TESSEL_CHECK(t.keep_last_checkpoints() >= 0)
      << "config: train.keep_last_checkpoints is " << t.keep_last_checkpoints()
      << "; expected 0 (keep all) or more";
  if (t.checkpoint_dir().empty()) t.set_checkpoint_dir(t.output_dir() + "/checkpoints");
  CheckOneOf("train.resume", t.resume(), {"auto", "required", "off"});
  CheckNumber("train.peak_tflops_per_device", t.peak_tflops_per_device(), 0, 1e6);
  for (int64_t iteration : t.timeline_iterations()) {
    TESSEL_CHECK(iteration >= 1 && iteration <= t.train_iter())
        << "config: train.timeline_iterations holds " << iteration
        << "; expected iterations 1 to train.train_iter (" << t.train_iter() << ")";
    TESSEL_CHECK(t.graph().enabled() && t.graph().pipeline() != "in_order")
        << "config: train.timeline_iterations is set but the step runs "
        << (t.graph().enabled() ? "on the in_order reference executor" : "eagerly")
        << "; timelines come from the actor runtime (train.graph.enabled true, a pipeline schedule)";
  }
  if (!t.best_checkpoint_metric().empty()) {
    // (A registered model's metrics are known once it is built.)
    if (!own)
      CheckOneOf("train.best_checkpoint_metric", t.best_checkpoint_metric(),
                 vision               ? std::vector<std::string>{"eval_loss", "eval_accuracy"}
                 : m.arch() == "bert" ? std::vector<std::string>{"eval_loss", "eval_mlm_loss",
                                                                 "eval_sentence_loss", "eval_mlm_perplexity"}
                                      : std::vector<std::string>{"eval_loss", "eval_perplexity"});
    TESSEL_CHECK(c->evaluation().enabled())
        << "config: train.best_checkpoint_metric is " << t.best_checkpoint_metric()
        << " but evaluation.enabled is false; the best checkpoint is the best evaluation's";
  }
  MaxDurationSeconds(t);  // checked now, used by the training loop

  const config::OptimConfig& o = c->optim();
  CheckOneOf("optim.name", o.name(), {"adamw"});
  CheckNumber("optim.lr", o.lr(), 0, 1e6, /*low_open=*/true);
  CheckNumber("optim.weight_decay", o.weight_decay(), 0, 1e6);
  CheckNumber("optim.beta1", o.beta1(), 0, 1, false, /*high_open=*/true);
  CheckNumber("optim.beta2", o.beta2(), 0, 1, false, /*high_open=*/true);
  CheckNumber("optim.eps", o.eps(), 0, 1, /*low_open=*/true);
  CheckNumber("optim.clip_grad_norm", o.clip_grad_norm(), 0, 1e30, /*low_open=*/true);
  const config::SchedulerConfig& s = c->scheduler();
  CheckOneOf("scheduler.name", s.name(), {"warmup_cosine", "warmup_linear", "constant"});
  TESSEL_CHECK(s.warmup_iter() >= 0 && s.warmup_iter() <= t.train_iter())
      << "config: scheduler.warmup_iter is " << s.warmup_iter() << "; expected 0 to train.train_iter ("
      << t.train_iter() << ")";
  TESSEL_CHECK(std::isfinite(s.min_lr()) && s.min_lr() >= 0 && s.min_lr() <= o.lr())
      << "config: scheduler.min_lr is " << s.min_lr() << "; expected 0 to optim.lr (" << o.lr() << ")";

  const config::DataConfig& data = c->data();
  if (vision) {
    TESSEL_CHECK(!data.image_dataset().empty())
        << "config: data.image_dataset is not set; expected a safetensors file of images and labels, or "
           "\"synthetic\"";
    TESSEL_CHECK(data.image_dataset() != "synthetic" || (m.num_classes() > 0 && data.synthetic_samples() > 0))
        << "config: data.image_dataset \"synthetic\" needs model.num_classes (" << m.num_classes()
        << ") and data.synthetic_samples (" << data.synthetic_samples() << ") positive";
  } else {
    if (m.arch() == "bert") CheckBertData(*c);
    if (t5) CheckT5Data(c);
    for (const auto& [field, set] :
         {std::pair<const char*, bool>{"noise_density", data.noise_density() != 0.15},
          {"mean_noise_span_length", data.mean_noise_span_length() != 3},
          {"eos_token_id", data.eos_token_id() != -1}})
      TESSEL_CHECK(t5 || own || !set)
          << "config: data." << field << " is a T5 (span corruption) setting, but "
          << "model.arch is '" << m.arch() << "'; leave it out";
    TESSEL_CHECK(data.blend_size() == 0 || m.arch() == "gpt2" || llama || t5 || own)
        << "config: data.blend is set for model.arch '" << m.arch()
        << "'; blending is for GPT, Llama and T5 so far, give "
        << "data.data_prefix";
    TESSEL_CHECK(data.blend_size() == 0 || data.data_prefix().empty())
        << "config: data.data_prefix and data.blend are both set; expected one (blend lists every dataset)";
    TESSEL_CHECK(data.blend_size() <= 255)
        << "config: data.blend has " << data.blend_size() << " datasets; expected at most 255";
    for (int i = 0; i < data.blend_size(); ++i) {
      const std::string field = "data.blend[" + std::to_string(i) + "]";
      CheckNumber(field + ".weight", data.blend(i).weight(), 0, 1e30, /*low_open=*/true);
      TESSEL_CHECK(!data.blend(i).data_prefix().empty())
          << "config: " << field << ".data_prefix is not set; expected the path prefix of an indexed dataset";
    }
    // A registered model may read data of its own.
    TESSEL_CHECK(own || !data.data_prefix().empty() || data.blend_size() > 0)
        << "config: data.data_prefix is not set; expected the path prefix of an indexed dataset "
           "(<prefix>.bin "
           "and <prefix>.idx), or data.blend";
  }
  const config::EvaluationConfig& e = c->evaluation();
  CheckSize("evaluation.eval_period", e.eval_period(), kMaxCount);
  if (vision)
    TESSEL_CHECK(e.eval_iter() >= 0 && e.eval_iter() <= kMaxCount)
        << "config: evaluation.eval_iter is " << e.eval_iter()
        << "; expected 0 (the whole validation split) to " << kMaxCount;
  else
    CheckSize("evaluation.eval_iter", e.eval_iter(), kMaxCount);
  // One micro-batch's widest activation on a rank must be one a device can hold.
  const double tokens =
      static_cast<double>(t.micro_batch_size()) *
      static_cast<double>(vision ? (m.image_size() / m.patch_size()) * (m.image_size() / m.patch_size()) + 1
                                 : m.max_seq_length());
  const double widest =
      std::max({static_cast<double>(m.ffn_hidden_size()), static_cast<double>(m.hidden_size()),
                vision ? 0.0 : static_cast<double>(m.vocab_size()) / static_cast<double>(tp)});
  TESSEL_CHECK(tokens * widest <= kMaxActivationElements)
      << "config: one micro-batch of train.micro_batch_size " << t.micro_batch_size() << " x "
      << static_cast<int64_t>(tokens / static_cast<double>(t.micro_batch_size()))
      << " tokens has activations of " << tokens * widest
      << " elements per rank (the widest: " << static_cast<int64_t>(widest)
      << " per token); expected at most 2^40: use smaller micro-batches";
  FillDefaults(c);  // last: the batch sizes above tell given from left out
}

bool AllToAllSequenceParallel(const config::DistConfig& d) {
  return d.sequence_parallel() && d.sequence_parallel_mode() == "all_to_all";
}

bool ContextParallel(const config::DistConfig& d) {
  return d.sequence_parallel() && d.sequence_parallel_mode() == "context";
}

bool SequencesSplitOverDataParallel(const config::DistConfig& d) {
  return AllToAllSequenceParallel(d) || ContextParallel(d);
}

bool MegatronSequenceParallel(const config::DistConfig& d) {
  return d.sequence_parallel() && d.sequence_parallel_mode() == "megatron";
}

std::string CanonicalArch(const std::string& arch) { return arch == "gpt" ? "gpt2" : arch; }

std::string ConfigText(const config::Config& config) {
  std::string text;
  pb::TextFormat::PrintToString(config, &text);
  return text;
}

int WorldSizeOf(const config::DistConfig& d) {
  constexpr int64_t kMost = int64_t{1} << 20;
  const int64_t tp = d.tensor_parallel_size(), pp = d.pipeline_parallel_size(),
                dp = std::max<int64_t>(d.data_parallel_size(), 1);
  TESSEL_CHECK(tp >= 1 && pp >= 1 && tp <= kMost && pp <= kMost && dp <= kMost && tp * pp <= kMost &&
               tp * pp * dp <= kMost)
      << "config: train.dist tensor_parallel_size " << tp << " x pipeline_parallel_size " << pp
      << " x data_parallel_size " << dp << "; expected a world of 1 to " << kMost << " ranks";
  return static_cast<int>(tp * pp * dp);
}

std::vector<std::string> TakeSetFlags(int* argc, char** argv, const char* program) {
  std::vector<std::string> overrides;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" || arg == "-set") {
      if (i + 1 >= *argc) {
        std::fprintf(stderr, "%s: --set needs a value, e.g. --set train.dist.tensor_parallel_size=2\n",
                     program);
        std::exit(2);
      }
      overrides.push_back(argv[++i]);
    } else if (arg.rfind("--set=", 0) == 0) {
      overrides.push_back(arg.substr(6));
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  argv[out] = nullptr;
  return overrides;
}

}  // namespace tessel::zoo
