#include "zoo/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "tests/testing/test_util.h"
#include "zoo/foreign_settings.h"
#include "zoo/vocabulary.h"

namespace tessel::zoo {
namespace {

using testing::ErrorOf;

// The message of the Error `fn` throws ("" if none).
config::Config Minimal() { return ParseConfig("data { data_prefix: \"corpus\" }", "test"); }

TEST(ConfigTest, ParsesFieldsAndLeavesDefaults) {
  config::Config c = ParseConfig(
      "model { hidden_layers: 6 hidden_size: 96 }\ntrain { dist { tensor_parallel_size: 2 } train_iter: 7 }",
      "test");
  EXPECT_EQ(c.model().hidden_layers(), 6);
  EXPECT_EQ(c.model().hidden_size(), 96);
  EXPECT_EQ(c.model().num_attention_heads(), 4);  // default
  EXPECT_EQ(c.train().dist().tensor_parallel_size(), 2);
  EXPECT_EQ(c.train().train_iter(), 7);
  EXPECT_FALSE(c.train().has_micro_batch_size());
}

TEST(ConfigTest, UnknownFieldIsNamedWithPathLineAndClosest) {
  const std::string e = ErrorOf([] {
    ParseConfig("model { hidden_size: 64 }\ntrain {\n  dist { tensor_paralel_size: 2 }\n}", "my.prototxt");
  });
  EXPECT_NE(e.find("my.prototxt:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown field 'tensor_paralel_size' in train.dist"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'tensor_parallel_size'?"), std::string::npos) << e;
  const std::string top = ErrorOf([] { ParseConfig("trian { train_iter: 3 }", "x"); });
  EXPECT_NE(top.find("unknown field 'trian' in the top level; did you mean 'train'?"), std::string::npos)
      << top;
  const std::string far = ErrorOf([] { ParseConfig("optim { momentum_of_doom: 3 }", "x"); });
  EXPECT_NE(far.find("its fields are name, lr, weight_decay"), std::string::npos) << far;
  const std::string type = ErrorOf([] { ParseConfig("train { train_iter: \"many\" }", "x"); });
  EXPECT_NE(type.find("x:1:"), std::string::npos) << type;
}

TEST(ConfigTest, OverridesReplaceValues) {
  config::Config c = Minimal();
  ApplyOverride(&c, "train.dist.tensor_parallel_size=4");
  ApplyOverride(&c, "data.data_prefix=/data/my corpus");
  ApplyOverride(&c, "train.dist.custom_pipeline_stage_id=[0,0,1]");
  ApplyOverride(&c, "train.dist.custom_pipeline_stage_id=[0,1]");  // replaced, not appended
  ApplyOverride(&c, "optim.lr=3e-4");
  ApplyOverride(&c, "train.graph.enabled=false");
  ApplyOverride(&c, "train.graph.pipeline=\"gpipe\"");
  EXPECT_EQ(c.train().dist().tensor_parallel_size(), 4);
  EXPECT_EQ(c.data().data_prefix(), "/data/my corpus");
  ASSERT_EQ(c.train().dist().custom_pipeline_stage_id_size(), 2);
  EXPECT_EQ(c.train().dist().custom_pipeline_stage_id(1), 1);
  EXPECT_DOUBLE_EQ(c.optim().lr(), 3e-4);
  EXPECT_FALSE(c.train().graph().enabled());
  EXPECT_EQ(c.train().graph().pipeline(), "gpipe");
}

TEST(ConfigTest, ACommandLineSettingAListTwiceKeepsEveryEntry) {
  // Two --set of a map field: both entries reach the config (a single
  // ApplyOverride would replace); the first replaces what the file had.
  config::Config c = Minimal();
  ApplyOverride(&c, "train.dist.tensor_parallel_mode_options={key:\"old\" value:\"0\"}");
  ApplyOverrides(&c,
                 {"train.dist.tensor_parallel_mode_options={key:\"depth\" value:\"2\"}",
                  "train.dist.tensor_parallel_size=4",
                  "train.dist.tensor_parallel_mode_options={key:\"rows\" value:\"3\"}",
                  "train.dist.custom_pipeline_stage_id=[0,0]", "train.dist.custom_pipeline_stage_id=[1]"});
  const auto& options = c.train().dist().tensor_parallel_mode_options();
  EXPECT_EQ(options.size(), 2u);
  EXPECT_EQ(options.count("old"), 0u);
  EXPECT_EQ(options.at("depth"), "2");
  EXPECT_EQ(options.at("rows"), "3");
  ASSERT_EQ(c.train().dist().custom_pipeline_stage_id_size(), 3);
  EXPECT_EQ(c.train().dist().custom_pipeline_stage_id(2), 1);
  EXPECT_EQ(c.train().dist().tensor_parallel_size(), 4);
}

TEST(ConfigTest, BadOverridesAreNamed) {
  config::Config c = Minimal();
  std::string e = ErrorOf([&] { ApplyOverride(&c, "train.dist.tensor_paralel_size=2"); });
  EXPECT_NE(e.find("unknown field 'tensor_paralel_size' in train.dist; did you mean 'tensor_parallel_size'?"),
            std::string::npos)
      << e;
  e = ErrorOf([&] { ApplyOverride(&c, "trian.train_iter=2"); });
  EXPECT_NE(e.find("unknown field 'trian' in the top level; did you mean 'train'?"), std::string::npos) << e;
  e = ErrorOf([&] { ApplyOverride(&c, "train.train_iter=lots"); });
  EXPECT_NE(e.find("'lots' is not a value of train.train_iter (int64)"), std::string::npos) << e;
  e = ErrorOf([&] { ApplyOverride(&c, "train.train_iter.x=2"); });
  EXPECT_NE(e.find("train.train_iter is a value, not a section"), std::string::npos) << e;
  e = ErrorOf([&] { ApplyOverride(&c, "train.train_iter"); });
  EXPECT_NE(e.find("expected path.to.field=value"), std::string::npos) << e;
}

// Resolves micro / global / accumulation for dp 2 (world 2) and returns them.
std::array<int64_t, 3> Batches(const std::string& train_fields) {
  config::Config c = ParseConfig("data { data_prefix: \"d\" } train { " + train_fields + " }", "test");
  ResolveConfig(&c, 2);
  return {c.train().micro_batch_size(), c.train().global_batch_size(), c.train().num_accumulation_steps()};
}

TEST(ConfigTest, AnyTwoBatchSizesGiveTheThird) {
  using B = std::array<int64_t, 3>;
  EXPECT_EQ(Batches("micro_batch_size: 4 global_batch_size: 32"), (B{4, 32, 4}));
  EXPECT_EQ(Batches("micro_batch_size: 4 num_accumulation_steps: 3"), (B{4, 24, 3}));
  EXPECT_EQ(Batches("global_batch_size: 48 num_accumulation_steps: 3"), (B{8, 48, 3}));
  EXPECT_EQ(Batches("micro_batch_size: 4 global_batch_size: 16 num_accumulation_steps: 2"), (B{4, 16, 2}));
  EXPECT_EQ(Batches("micro_batch_size: 5"), (B{5, 10, 1}));
  EXPECT_EQ(Batches("global_batch_size: 12"), (B{6, 12, 1}));
  EXPECT_EQ(Batches("num_accumulation_steps: 2"), (B{8, 32, 2}));
  EXPECT_EQ(Batches(""), (B{8, 16, 1}));
  std::string e =
      ErrorOf([] { Batches("micro_batch_size: 4 global_batch_size: 16 num_accumulation_steps: 3"); });
  EXPECT_NE(e.find("train.global_batch_size is 16 but micro_batch_size x data_parallel_size x "
                   "num_accumulation_steps = 4 x 2 x 3 = 24"),
            std::string::npos)
      << e;
  e = ErrorOf([] { Batches("micro_batch_size: 4 global_batch_size: 20"); });
  EXPECT_NE(
      e.find("train.global_batch_size 20 is not divisible by micro_batch_size x data_parallel_size = 4 x 2"),
      std::string::npos)
      << e;
  e = ErrorOf([] { Batches("global_batch_size: 10 num_accumulation_steps: 3"); });
  EXPECT_NE(e.find("is not divisible by data_parallel_size x num_accumulation_steps = 2 x 3 = 6"),
            std::string::npos)
      << e;
  e = ErrorOf([] { Batches("micro_batch_size: 0"); });
  EXPECT_NE(e.find("train.micro_batch_size is 0; expected 1 to 2147483648"), std::string::npos) << e;
}

// The error ResolveConfig gives for `text` on `world` ranks.
std::string ResolveError(const std::string& text, int world) {
  return ErrorOf([&] {
    config::Config c = ParseConfig(text, "test");
    ResolveConfig(&c, world);
  });
}

// Out-of-range numbers are refused while resolving, naming the field, before
// anything is allocated: sizes whose products would overflow or could never
// be held, counts that would spin or exhaust memory, and hyper-parameters
// that can only train into NaN (each of these crashed, spun or trained into
// NaN before).
TEST(ConfigTest, OutOfRangeNumbersAreNamed) {
  const std::string data = "data { data_prefix: \"d\" } ";
  const std::pair<std::string, std::string> cases[] = {
      {"model { hidden_size: 4611686018427387904 }",
       "model.hidden_size is 4611686018427387904; expected 1 to"},
      {"model { ffn_hidden_size: 4611686018427387904 }", "model.ffn_hidden_size is 4611686018427387904"},
      {"model { vocab_size: 4611686018427387904 }", "model.vocab_size is 4611686018427387904"},
      {"model { hidden_layers: 1000000000 }", "model.hidden_layers is 1000000000"},
      {"model { max_seq_length: 1000000000 max_position_embeddings: 1000000000 }",
       "model.max_seq_length is 1000000000"},
      {"model { layernorm_epsilon: inf }", "model.layernorm_epsilon is inf; expected a finite number"},
      {"model { layernorm_epsilon: nan }", "model.layernorm_epsilon is nan"},
      {"model { initializer_range: -1 }", "model.initializer_range is -1"},
      {"train { dist { tensor_parallel_size: 4611686018427387904 pipeline_parallel_size: 4 } }",
       "train.dist.tensor_parallel_size is 4611686018427387904; expected 1 to 4"},
      {"train { train_iter: 1000000000000 }", "train.train_iter is 1000000000000"},
      {"train { global_batch_size: 4611686018427387904 }", "train.global_batch_size is 4611686018427387904"},
      {"train { micro_batch_size: 1000000000 num_accumulation_steps: 1000 }",
       "train.micro_batch_size x data_parallel_size x num_accumulation_steps"},
      {"train { micro_batch_size: 1000000000 }", "one micro-batch of train.micro_batch_size 1000000000"},
      {"optim { lr: inf }", "optim.lr is inf"},
      {"optim { beta2: -0.5 }", "optim.beta2 is -0.5"},
      {"optim { beta1: 1.5 }", "optim.beta1 is 1.5"},
      {"optim { eps: -1 }", "optim.eps is -1"},
      {"optim { weight_decay: -5 }", "optim.weight_decay is -5"},
      {"optim { clip_grad_norm: nan }", "optim.clip_grad_norm is nan"},
      {"scheduler { min_lr: nan }", "scheduler.min_lr is nan"},
      {"evaluation { eval_iter: 1000000000000 }", "evaluation.eval_iter is 1000000000000"},
  };
  for (const auto& [text, want] : cases) {
    const std::string e = ResolveError(data + text, 4);
    EXPECT_NE(e.find(want), std::string::npos) << text << "\n  gave: " << e;
  }
}

TEST(ConfigTest, DistSizesAreCheckedAgainstTheWorld) {
  const std::string data = "data { data_prefix: \"d\" } ";
  config::Config c =
      ParseConfig(data + "train { dist { tensor_parallel_size: 2 pipeline_parallel_size: 2 } }", "t");
  ResolveConfig(&c, 8);
  EXPECT_EQ(c.train().dist().data_parallel_size(), 2);
  EXPECT_EQ(c.train().dist().pipeline_num_layers(), 2);
  EXPECT_EQ(c.model().ffn_hidden_size(), 256);
  std::string e = ResolveError(data + "train { dist { tensor_parallel_size: 3 } }", 4);
  EXPECT_NE(e.find("4 ranks cannot be split into tensor_parallel_size 3 x pipeline_parallel_size 1 = 3"),
            std::string::npos)
      << e;
  e = ResolveError(data + "train { dist { data_parallel_size: 2 tensor_parallel_size: 2 } }", 8);
  EXPECT_NE(e.find("= 2 x 2 x 1 = 4 but the job has 8 ranks"), std::string::npos) << e;
  e = ResolveError(
      data + "model { num_attention_heads: 3 hidden_size: 48 } train { dist { tensor_parallel_size: 2 } }",
      2);
  EXPECT_NE(e.find("model.num_attention_heads 3 is not divisible by train.dist.tensor_parallel_size 2"),
            std::string::npos)
      << e;
  e = ResolveError(data + "model { hidden_layers: 2 } train { dist { pipeline_parallel_size: 4 } }", 4);
  EXPECT_NE(e.find("model.hidden_layers 2 is fewer than train.dist.pipeline_parallel_size 4"),
            std::string::npos)
      << e;
  e = ResolveError(data +
                       "model { hidden_layers: 4 } train { dist { pipeline_parallel_size: 2 "
                       "custom_pipeline_stage_id: [0, 1] } }",
                   2);
  EXPECT_NE(e.find("custom_pipeline_stage_id has 2 entries; expected one per layer (4)"), std::string::npos)
      << e;
  // Virtual stages: a layer each, a pipeline, graph mode, and under
  // interleaved_1f1b micro-batches in whole rounds of the stages.
  e = ResolveError(data +
                       "model { hidden_layers: 3 } train { dist { pipeline_parallel_size: 2 "
                       "virtual_pipeline_size: 2 } }",
                   2);
  EXPECT_NE(
      e.find(
          "model.hidden_layers 3 is fewer than train.dist.pipeline_parallel_size 2 x virtual_pipeline_size "
          "2; every virtual stage needs a layer"),
      std::string::npos)
      << e;
  e = ResolveError(data + "model { hidden_layers: 4 } train { dist { virtual_pipeline_size: 2 } }", 1);
  EXPECT_NE(
      e.find(
          "train.dist.virtual_pipeline_size is 2; expected 1, or more model chunks per stage of a pipeline "
          "(pipeline_parallel_size 1)"),
      std::string::npos)
      << e;
  e = ResolveError(
      data +
          "model { hidden_layers: 4 } train { dist { pipeline_parallel_size: 2 virtual_pipeline_size: "
          "2 } micro_batch_size: 1 num_accumulation_steps: 3 graph { pipeline: \"interleaved_1f1b\" } }",
      2);
  EXPECT_NE(
      e.find("train.num_accumulation_steps is 3; interleaved_1f1b runs micro-batches in rounds of the 2 "
             "stages, so expected a multiple of train.dist.pipeline_parallel_size"),
      std::string::npos)
      << e;
  config::Config interleaved = ParseConfig(
      data +
          "model { hidden_layers: 4 } train { dist { pipeline_parallel_size: 2 virtual_pipeline_size: 2 } "
          "micro_batch_size: 1 num_accumulation_steps: 4 graph { pipeline: \"interleaved_1f1b\" } }",
      "t");
  ResolveConfig(&interleaved, 2);
  EXPECT_EQ(interleaved.train().dist().virtual_pipeline_size(), 2);
  // A vocabulary tp does not divide is the model's to pad, not an error.
  config::Config padded =
      ParseConfig(data +
                      "model { hidden_size: 60 num_attention_heads: 4 vocab_size: 1001 } train { dist { "
                      "tensor_parallel_size: 2 } }",
                  "padded");
  EXPECT_NO_THROW(ResolveConfig(&padded, 2));
}

TEST(ConfigTest, NamesAndRangesAreChecked) {
  const std::string data = "data { data_prefix: \"d\" } ";
  // Schedule, mode and handler names are the training program's to check
  // against its registries; the config only refuses empty ones.
  std::string e = ResolveError(data + "train { graph { pipeline: \"\" } }", 1);
  EXPECT_NE(e.find("train.graph.pipeline is empty"), std::string::npos) << e;
  e = ResolveError(data + "train { gradient_handler { options { key: \"max_value\" value: \"1\" } } }", 1);
  EXPECT_NE(e.find("train.gradient_handler[0] has no name"), std::string::npos) << e;
  e = ResolveError(data + "train { dist { sequence_parallel_mode: \"all_to_all\" } }", 2);
  EXPECT_NE(e.find("sequence_parallel_mode is 'all_to_all' but train.dist.sequence_parallel is false"),
            std::string::npos)
      << e;
  e = ResolveError(data + "scheduler { name: \"cosine\" }", 1);
  EXPECT_NE(e.find("scheduler.name is 'cosine'; expected one of warmup_cosine, warmup_linear, constant"),
            std::string::npos)
      << e;
  e = ResolveError(data + "model { arch: \"mistral\" }", 1);
  EXPECT_NE(e.find("model.arch is 'mistral'; expected one of gpt2, gpt, llama, t5, bert, vit"),
            std::string::npos)
      << e;
  e = ResolveError(data + "model { hidden_act: \"gelu_new\" }", 1);
  EXPECT_NE(e.find("model.hidden_act is 'gelu_new'; expected one of gelu_tanh, gelu"), std::string::npos)
      << e;
  e = ResolveError(data + "model { attention_dropout_prob: 1.5 }", 1);
  EXPECT_NE(e.find("model.attention_dropout_prob is 1.5; expected 0 <= p < 1"), std::string::npos) << e;
  e = ResolveError("train { train_iter: 5 }", 1);
  EXPECT_NE(e.find("data.data_prefix is not set"), std::string::npos) << e;
  e = ResolveError(data + "train { train_iter: 5 } scheduler { warmup_iter: 6 }", 1);
  EXPECT_NE(e.find("scheduler.warmup_iter is 6; expected 0 to train.train_iter (5)"), std::string::npos) << e;
  e = ResolveError(data + "train { activation_checkpoint: true graph { enabled: false } }", 1);
  EXPECT_NE(e.find("train.activation_checkpoint is true but train.graph.enabled is false"), std::string::npos)
      << e;
}

TEST(ConfigTest, ResolvedTextRoundTripsWithEveryValue) {
  config::Config c = Minimal();
  ResolveConfig(&c, 1);
  const std::string text = ConfigText(c);
  for (const char* field : {"hidden_layers: 2", "data_parallel_size: 1", "micro_batch_size: 8",
                            "num_accumulation_steps: 1", "pipeline: \"1f1b\"", "name: \"warmup_cosine\""})
    EXPECT_NE(text.find(field), std::string::npos) << field << " not in\n" << text;
  config::Config again = ParseConfig(text, "resolved");
  EXPECT_EQ(again.SerializeAsString(), c.SerializeAsString());
}

TEST(ConfigTest, LoadConfigResolvesTheDataPrefixBesideTheFile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessel_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "configs");
  std::ofstream(dir / "configs" / "c.prototxt") << "data { data_prefix: \"../data/corpus\" }\n";
  config::Config c = LoadConfig((dir / "configs" / "c.prototxt").string());
  EXPECT_EQ(c.data().data_prefix(), (dir / "data" / "corpus").string());
  const std::string e = ErrorOf([&] { LoadConfig((dir / "missing.prototxt").string()); });
  EXPECT_NE(e.find("missing.prototxt: cannot read it"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, IncludesComposeConfigsAndTheIncluderWins) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessel_config_include_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "configs" / "common");
  std::filesystem::create_directories(dir / "elsewhere");
  std::ofstream(dir / "configs" / "common" / "base.prototxt")
      << "model { hidden_layers: 12 hidden_size: 768 num_attention_heads: 12 }\n"
         "train { dist { custom_pipeline_stage_id: [0, 0, 1] } train_iter: 500 log_period: 7 }\n"
         "data { data_prefix: \"../../data/corpus\" }\n";
  std::ofstream(dir / "configs" / "common" / "optim.prototxt") << "optim { lr: 0.5 beta2: 0.95 }\n";
  std::ofstream(dir / "configs" / "mine.prototxt")
      << "include: \"common/base.prototxt\"\ninclude: \"common/optim.prototxt\"\n"
         "model { hidden_size: 1024 }\ntrain { dist { custom_pipeline_stage_id: [0, 1] } }\noptim { lr: 0.25 "
         "}\n";
  config::Config c = LoadConfig((dir / "configs" / "mine.prototxt").string());
  EXPECT_EQ(c.model().hidden_layers(), 12);                        // from the base
  EXPECT_EQ(c.model().hidden_size(), 1024);                        // the includer's
  EXPECT_EQ(c.train().train_iter(), 500);                          // from the base
  EXPECT_EQ(c.train().log_period(), 7);                            // from the base
  EXPECT_DOUBLE_EQ(c.optim().lr(), 0.25);                          // the includer's over the second include
  EXPECT_DOUBLE_EQ(c.optim().beta2(), 0.95);                       // the second include's
  ASSERT_EQ(c.train().dist().custom_pipeline_stage_id_size(), 2);  // a list is replaced, not appended to
  EXPECT_EQ(c.train().dist().custom_pipeline_stage_id(1), 1);
  EXPECT_EQ(c.include_size(), 0);
  // A path is relative to the file that gives it.
  EXPECT_EQ(c.data().data_prefix(), (dir / "data" / "corpus").string());

  // An included file's mistakes are named with that file; missing files and
  // cycles are named.
  std::ofstream(dir / "configs" / "bad_base.prototxt") << "model { hiden_size: 3 }\n";
  std::ofstream(dir / "configs" / "uses_bad.prototxt") << "include: \"bad_base.prototxt\"\n";
  std::string e = ErrorOf([&] { LoadConfig((dir / "configs" / "uses_bad.prototxt").string()); });
  EXPECT_NE(e.find("bad_base.prototxt"), std::string::npos) << e;
  EXPECT_NE(e.find("hiden_size"), std::string::npos) << e;
  std::ofstream(dir / "configs" / "missing.prototxt") << "include: \"nowhere.prototxt\"\n";
  e = ErrorOf([&] { LoadConfig((dir / "configs" / "missing.prototxt").string()); });
  EXPECT_NE(e.find("nowhere.prototxt: cannot read it"), std::string::npos) << e;
  EXPECT_NE(e.find("included by"), std::string::npos) << e;
  std::ofstream(dir / "configs" / "a.prototxt") << "include: \"b.prototxt\"\n";
  std::ofstream(dir / "configs" / "b.prototxt") << "include: \"a.prototxt\"\n";
  e = ErrorOf([&] { LoadConfig((dir / "configs" / "a.prototxt").string()); });
  EXPECT_NE(e.find("includes itself"), std::string::npos) << e;
  // Each level including the next twice: 2^16 reads, refused early.
  for (int level = 0; level < 16; ++level)
    std::ofstream(dir / "configs" / ("fan" + std::to_string(level) + ".prototxt"))
        << "include: \"fan" << level + 1 << ".prototxt\"\ninclude: \"fan" << level + 1 << ".prototxt\"\n";
  std::ofstream(dir / "configs" / "fan16.prototxt") << "model { hidden_size: 8 }\n";
  e = ErrorOf([&] { LoadConfig((dir / "configs" / "fan0.prototxt").string()); });
  EXPECT_NE(e.find("more than 256 files read through includes"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, TheBundledConfigResolvesForFourRanks) {
  config::Config c = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2_tiny.prototxt");
  ResolveConfig(&c, 4);
  EXPECT_EQ(c.train().dist().data_parallel_size(), 1);
  EXPECT_EQ(c.train().num_accumulation_steps(), 4);
  EXPECT_TRUE(std::filesystem::exists(c.data().data_prefix() + ".idx")) << c.data().data_prefix();
}

TEST(ConfigTest, TheWorldAConfigLaysOutWithoutALaunch) {
  config::DistConfig d;
  d.set_tensor_parallel_size(8);
  d.set_pipeline_parallel_size(16);
  EXPECT_EQ(WorldSizeOf(d), 128);  // dp left to the world: 1
  d.set_data_parallel_size(8);
  EXPECT_EQ(WorldSizeOf(d), 1024);
  d.set_tensor_parallel_size(int64_t{1} << 40);
  const std::string e = ErrorOf([&] { WorldSizeOf(d); });
  EXPECT_NE(e.find("expected a world of 1 to 1048576 ranks"), std::string::npos) << e;
}

// data.vocab_file: the size and BERT's special ids from the tokenizer's
// file where the config leaves them out, checked where it gives them.
// A Hugging Face tokenizer.json (Llama's, T5's) as data.vocab_file: its
// model's vocabulary and its added special tokens give model.vocab_size.
TEST(ConfigTest, ATokenizerJsonGivesTheVocabularySize) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "tessel_tokenizer_json_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json")
      << R"({"added_tokens": [{"id": 6, "content": "<|begin_of_text|>"}, {"id": 7, "content": "<|end_of_text|>"},
             {"id": 0, "content": "a"}],
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4, "model": 5}}})";
  config::Config llama = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/llama_tiny.prototxt");
  llama.mutable_data()->set_vocab_file((dir / "tokenizer.json").string());
  ResolveConfig(&llama, 4);
  EXPECT_EQ(llama.model().vocab_size(), 8);
  // Unigram's list of [token, score]: the index is the id.
  EXPECT_EQ(ParseTokenizerJson(R"({"model": {"vocab": [["<pad>", 0], ["</s>", 0], ["x", -1]]}})", "t").size(),
            3u);
  const std::string clash = ErrorOf([] {
    ParseTokenizerJson(
        R"({"added_tokens": [{"id": 1, "content": "<s>"}], "model": {"vocab": {"a": 0, "b": 1}}})", "t.json");
  });
  EXPECT_NE(clash.find("tokenizer t.json: id 1 is given to 'b' and to '<s>'"), std::string::npos) << clash;
  const std::string not_one = ErrorOf([] { ParseTokenizerJson(R"({"vocab": {"a": 0}})", "v.json"); });
  EXPECT_NE(not_one.find("not a tokenizer.json"), std::string::npos) << not_one;
  // A vocab.json whose token "model" is an id is still a vocab.json.
  std::ofstream(dir / "vocab.json") << R"({"model": 0, "b": 1})";
  EXPECT_EQ(ReadVocabulary(dir / "vocab.json").size(), 2u);
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, TheVocabularyFileGivesTheSizeAndTheSpecialTokens) {
  config::Config gpt = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2_tiny.prototxt");
  EXPECT_FALSE(gpt.model().has_vocab_size());
  ResolveConfig(&gpt, 4);
  EXPECT_EQ(gpt.model().vocab_size(), 2048);  // vocab.json's tokens
  config::Config bert = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/bert_tiny.prototxt");
  ResolveConfig(&bert, 4);
  EXPECT_EQ(bert.model().vocab_size(), 2048);  // bert-vocab.txt's lines
  EXPECT_EQ(bert.data().cls_token_id(), 101);
  EXPECT_EQ(bert.data().sep_token_id(), 102);
  EXPECT_EQ(bert.data().mask_token_id(), 103);
  EXPECT_EQ(bert.data().pad_token_id(), 0);

  // A WordPiece file with the special tokens elsewhere: their ids follow it.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "tessel_vocab_file_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "vocab.txt") << "[UNK]\nhello\n[SEP]\n[PAD]\n[CLS]\nworld\n[MASK]\n";
  config::Config moved = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/bert_tiny.prototxt");
  moved.mutable_data()->set_vocab_file((dir / "vocab.txt").string());
  ResolveConfig(&moved, 4);
  EXPECT_EQ(moved.model().vocab_size(), 7);
  EXPECT_EQ(moved.data().cls_token_id(), 4);
  EXPECT_EQ(moved.data().sep_token_id(), 2);
  EXPECT_EQ(moved.data().mask_token_id(), 6);
  EXPECT_EQ(moved.data().pad_token_id(), 3);
  EXPECT_EQ(moved.model().pad_token_id(), 3);  // the embedding's padding row goes with it

  auto error_with = [&](const std::function<void(config::Config*)>& change) {
    config::Config c = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/bert_tiny.prototxt");
    c.mutable_data()->set_vocab_file((dir / "vocab.txt").string());
    change(&c);
    return ErrorOf([&] { ResolveConfig(&c, 4); });
  };
  std::string e = error_with([](config::Config* c) { c->mutable_model()->set_vocab_size(5); });
  EXPECT_NE(e.find("model.vocab_size is 5 but data.vocab_file"), std::string::npos) << e;
  EXPECT_NE(e.find("holds 7 tokens"), std::string::npos) << e;
  e = error_with([](config::Config* c) { c->mutable_data()->set_cls_token_id(101); });
  EXPECT_NE(e.find("data.cls_token_id is 101 but [CLS] is id 4 in"), std::string::npos) << e;
  std::ofstream(dir / "no_mask.txt") << "[UNK]\n[SEP]\n[PAD]\n[CLS]\n";
  e = error_with(
      [&](config::Config* c) { c->mutable_data()->set_vocab_file((dir / "no_mask.txt").string()); });
  EXPECT_NE(e.find("has no [MASK] token; set data.mask_token_id"), std::string::npos) << e;
  std::ofstream(dir / "bad.json") << R"({"a": 0, "b": 0})";
  config::Config twice = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2_tiny.prototxt");
  twice.mutable_data()->set_vocab_file((dir / "bad.json").string());
  e = ErrorOf([&] { ResolveConfig(&twice, 4); });
  EXPECT_NE(e.find("id 0 is given to 'a' and to 'b'"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, TheStandardSizeConfigsResolveForEightRanks) {
  struct Expected {
    const char* file;
    int64_t layers, hidden, dp, accumulation;
  };
  for (const Expected& e : {Expected{"gpt2_124m", 12, 768, 8, 4}, Expected{"gpt2_355m", 24, 1024, 4, 8},
                            Expected{"gpt2_1.3b", 24, 2048, 2, 64}}) {
    SCOPED_TRACE(e.file);
    config::Config c = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/" + e.file + ".prototxt");
    ResolveConfig(&c, 8);
    EXPECT_EQ(c.model().vocab_size(), 50257);
    EXPECT_EQ(c.model().hidden_layers(), e.layers);
    EXPECT_EQ(c.model().hidden_size(), e.hidden);
    EXPECT_EQ(c.model().ffn_hidden_size(), 4 * e.hidden);
    EXPECT_EQ(c.train().dist().data_parallel_size(), e.dp);
    EXPECT_EQ(c.train().num_accumulation_steps(), e.accumulation);
  }
}

TEST(ConfigTest, TheLlamaConfigsResolveAndTheirSavedFormResolvesToItself) {
  config::Config tiny = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/llama_tiny.prototxt");
  ResolveConfig(&tiny, 4);
  EXPECT_EQ(tiny.model().hidden_act(), "silu");
  EXPECT_EQ(tiny.model().num_key_value_heads(), 2);
  EXPECT_EQ(tiny.model().rope_scaling().rope_type(), "");  // no scaling unless asked
  config::Config big = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/llama3_8b.prototxt");
  ResolveConfig(&big, 8);
  EXPECT_EQ(big.model().num_key_value_heads(), 8);
  EXPECT_EQ(big.model().ffn_hidden_size(), 14336);
  EXPECT_EQ(big.model().rope_scaling().rope_type(), "llama3");
  EXPECT_EQ(big.model().rope_scaling().original_max_position_embeddings(), 8192);
  EXPECT_EQ(big.train().dist().data_parallel_size(), 1);
  // The saved config (every field written) resolves to itself: resuming
  // neither turns scaling on nor calls a GPT's defaults Llama settings.
  for (config::Config* c : {&tiny, &big}) {
    config::Config again = ParseConfig(ConfigText(*c), "saved");
    ResolveConfig(&again, c == &tiny ? 4 : 8);
    EXPECT_EQ(ConfigText(again), ConfigText(*c));
  }
  config::Config gpt = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2_tiny.prototxt");
  ResolveConfig(&gpt, 4);
  config::Config gpt_again = ParseConfig(ConfigText(gpt), "saved");
  EXPECT_NO_THROW(ResolveConfig(&gpt_again, 4));
  // Llama's ffn rule when left out: 2/3 of 4h rounded up to 256.
  config::Config rule = ParseConfig(
      "model { arch: \"llama\" hidden_size: 4096 num_attention_heads: 32 } data { data_prefix: \"x\" }", "x");
  ResolveConfig(&rule, 1);
  EXPECT_EQ(rule.model().ffn_hidden_size(), 11008);
}

TEST(ConfigTest, LlamaSettingsThatCannotWorkAreNamed) {
  auto error = [](const std::string& model, int world = 1) {
    return ErrorOf([&] {
      config::Config c = ParseConfig("model { " + model + " }", "x");
      ResolveConfig(&c, world);
    });
  };
  EXPECT_NE(error("arch: \"llama\" num_attention_heads: 4 num_key_value_heads: 3")
                .find("model.num_attention_heads 4 is not divisible by model.num_key_value_heads 3"),
            std::string::npos);
  EXPECT_NE(error("arch: \"llama\" hidden_size: 60 num_attention_heads: 4")
                .find("must be a whole, even head dimension"),
            std::string::npos);
  EXPECT_NE(error("arch: \"llama\" rope_scaling { rope_type: \"yarn\" }")
                .find("model.rope_scaling.rope_type is 'yarn'"),
            std::string::npos);
  EXPECT_NE(
      error("arch: \"llama\" rope_scaling { rope_type: \"llama3\" low_freq_factor: 4 high_freq_factor: 1 }")
          .find("expected 0 < low < high"),
      std::string::npos);
  EXPECT_NE(error("arch: \"gpt2\" rope_theta: 500000").find("model.rope_theta is a Llama setting"),
            std::string::npos);
  EXPECT_NE(error("arch: \"gpt2\" tie_word_embeddings: true")
                .find("model.tie_word_embeddings is a Llama and T5 setting"),
            std::string::npos);
}

TEST(ConfigTest, TheT5ConfigsResolveAndTheirSavedFormResolvesToItself) {
  config::Config tiny = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/t5_tiny.prototxt");
  ResolveConfig(&tiny, 4);
  EXPECT_EQ(tiny.model().num_decoder_layers(), 2);
  EXPECT_EQ(tiny.model().head_dim(), 32);
  EXPECT_EQ(tiny.model().layernorm_epsilon(), 1e-6);        // T5's when left out
  EXPECT_EQ(tiny.train().dist().pipeline_num_layers(), 4);  // encoder and decoder
  EXPECT_EQ(tiny.data().eos_token_id(), 0);                 // the bundled vocabulary's <|endoftext|>
  config::Config base = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/t5_base.prototxt");
  ResolveConfig(&base, 8);
  EXPECT_EQ(base.train().dist().data_parallel_size(), 2);
  EXPECT_EQ(base.train().dist().pipeline_num_layers(), 24);
  EXPECT_EQ(base.train().num_accumulation_steps(), 4);
  for (config::Config* c : {&tiny, &base}) {
    config::Config again = ParseConfig(ConfigText(*c), "saved");
    ResolveConfig(&again, c == &tiny ? 4 : 8);
    EXPECT_EQ(ConfigText(again), ConfigText(*c));
  }
  // Left out: the decoder as deep as the encoder, v1.1's feed-forward,
  // T5's eos without a vocabulary file.
  config::Config bare =
      ParseConfig("model { arch: \"t5\" hidden_layers: 3 } data { data_prefix: \"x\" }", "x");
  ResolveConfig(&bare, 1);
  EXPECT_EQ(bare.model().num_decoder_layers(), 3);
  EXPECT_EQ(bare.model().hidden_act(), "gated-gelu");
  EXPECT_EQ(bare.data().eos_token_id(), 1);
  EXPECT_EQ(bare.train().dist().pipeline_num_layers(), 6);
}

TEST(ConfigTest, T5SettingsThatCannotWorkAreNamed) {
  auto error = [](const std::string& text, int world = 1) {
    return ErrorOf([&] {
      const bool data = text.find("data {") != std::string::npos;
      config::Config c = ParseConfig(data ? text : text + " data { data_prefix: \"x\" }", "x");
      ResolveConfig(&c, world);
    });
  };
  EXPECT_NE(error("model { arch: \"t5\" hidden_act: \"silu\" }").find("model.hidden_act is 'silu'"),
            std::string::npos);
  EXPECT_NE(
      error("model { arch: \"t5\" relative_attention_num_buckets: 8 relative_attention_max_distance: 2 }")
          .find("at least 4 buckets and a distance beyond the exact ones"),
      std::string::npos);
  EXPECT_NE(
      error("model { arch: \"t5\" hidden_size: 60 num_attention_heads: 8 }").find("give model.head_dim"),
      std::string::npos);
  EXPECT_NE(error("model { arch: \"t5\" attention_dropout_prob: 0.1 }").find("tessel's T5 has no dropout"),
            std::string::npos);
  EXPECT_NE(
      error("model { arch: \"t5\" hidden_layers: 1 num_decoder_layers: 1 } "
            "train { dist { pipeline_parallel_size: 4 } }",
            4)
          .find(
              "model.hidden_layers + num_decoder_layers 2 is fewer than train.dist.pipeline_parallel_size 4"),
      std::string::npos);
  EXPECT_NE(error("model { arch: \"t5\" } data { data_prefix: \"x\" eos_token_id: 5000 }")
                .find("data.eos_token_id is 5000"),
            std::string::npos);
  EXPECT_NE(error("model { arch: \"t5\" } data { data_prefix: \"x\" mean_noise_span_length: 0.5 }")
                .find("data.mean_noise_span_length is 0.5"),
            std::string::npos);
  EXPECT_NE(error("model { arch: \"gpt2\" head_dim: 16 }").find("model.head_dim is a T5 setting"),
            std::string::npos);
  EXPECT_NE(error("model { arch: \"llama\" } data { data_prefix: \"x\" noise_density: 0.3 }")
                .find("data.noise_density is a T5 (span corruption) setting"),
            std::string::npos);
}

TEST(ConfigTest, TheViTConfigsResolve) {
  config::Config tiny = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/vit_tiny.prototxt");
  ResolveConfig(&tiny, 1);
  EXPECT_EQ(tiny.train().num_accumulation_steps(), 2);
  EXPECT_TRUE(std::filesystem::exists(tiny.data().image_dataset())) << tiny.data().image_dataset();
  struct Expected {
    const char* file;
    int64_t hidden, heads, dp;
  };
  for (const Expected& e : {Expected{"vit_ti16_224", 192, 3, 8}, Expected{"vit_s16_224", 384, 6, 4},
                            Expected{"vit_b16_224", 768, 12, 4}}) {
    SCOPED_TRACE(e.file);
    config::Config c = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/" + e.file + ".prototxt");
    ResolveConfig(&c, 8);
    EXPECT_EQ(c.model().hidden_size(), e.hidden);
    EXPECT_EQ(c.model().num_attention_heads(), e.heads);
    EXPECT_EQ(c.model().ffn_hidden_size(), 4 * e.hidden);
    EXPECT_EQ(c.model().image_size() / c.model().patch_size(), 14);
    EXPECT_EQ(c.train().dist().data_parallel_size(), e.dp);
    EXPECT_EQ(c.data().image_dataset(), "synthetic");
  }
}

TEST(ConfigTest, VisionFieldsAreChecked) {
  const std::string vit = "model { arch: \"vit\" image_size: 8 patch_size: 2 num_classes: 10 } ";
  std::string e = ResolveError(vit, 1);
  EXPECT_NE(e.find("data.image_dataset is not set"), std::string::npos) << e;
  e = ResolveError("model { arch: \"vit\" image_size: 8 patch_size: 3 } data { image_dataset: \"x\" }", 1);
  EXPECT_NE(e.find("model.image_size 8 is not a multiple of model.patch_size 3"), std::string::npos) << e;
  e = ResolveError(
      "model { arch: \"vit\" image_size: 8 patch_size: 2 } data { image_dataset: \"synthetic\" }", 1);
  EXPECT_NE(e.find("\"synthetic\" needs model.num_classes (0)"), std::string::npos) << e;
  // eval_iter 0 is the whole validation split for images, an error for text.
  config::Config whole =
      ParseConfig(vit + "data { image_dataset: \"x\" } evaluation { eval_iter: 0 }", "vit");
  EXPECT_NO_THROW(ResolveConfig(&whole, 1));
  e = ResolveError("data { data_prefix: \"d\" } evaluation { eval_iter: 0 }", 1);
  EXPECT_NE(e.find("evaluation.eval_iter"), std::string::npos) << e;
  // The image file is found beside the config, like the data prefix.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessel_config_vit_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "configs");
  std::ofstream(dir / "configs" / "v.prototxt") << "data { image_dataset: \"../data/x.safetensors\" }\n";
  EXPECT_EQ(LoadConfig((dir / "configs" / "v.prototxt").string()).data().image_dataset(),
            (dir / "data" / "x.safetensors").string());
  std::ofstream(dir / "configs" / "s.prototxt") << "data { image_dataset: \"synthetic\" }\n";
  EXPECT_EQ(LoadConfig((dir / "configs" / "s.prototxt").string()).data().image_dataset(), "synthetic");
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, ClosestNameIsATypoDistanceAway) {
  EXPECT_EQ(ClosestName("tensor_paralel_size", {"data_parallel_size", "tensor_parallel_size"}),
            "tensor_parallel_size");
  EXPECT_EQ(ClosestName("lr", {"lr", "eps"}), "lr");
  EXPECT_EQ(ClosestName("learning_rate", {"lr", "eps", "name"}), "");
  EXPECT_EQ(ClosestName("x", {}), "");
  // The nearer of two candidates wins whichever comes first; a long name
  // near nothing is answered without reading it against each candidate.
  EXPECT_EQ(ClosestName("micro_batch_sise", {"micro_batch_size_x", "micro_batch_size"}), "micro_batch_size");
  EXPECT_EQ(ClosestName("micro_batch_sise", {"micro_batch_size", "micro_batch_size_x"}), "micro_batch_size");
  EXPECT_EQ(ClosestName(std::string(8000, 'q') + "lr", {"lr", "eps", "tensor_parallel_size"}), "");
  EXPECT_EQ(ClosestName(std::string(30, 'q'), {std::string(24, 'q'), std::string(20, 'q')}),
            std::string(24, 'q'));
}

// Another trainer's setting names tessel's instead of a far-off typo
// guess, in a config file and in --set alike.
TEST(ConfigTest, AMegatronSettingNamesTesselsField) {
  try {
    ParseConfig("train { log_interval: 10 }", "m.prototxt");
    FAIL() << "log_interval parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Megatron-LM's --log-interval), here: --set train.log_period=N"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(ForeignSettingInstead("save-interval"), "--set train.save_period=N");
  EXPECT_EQ(ForeignSettingInstead("save_interval"), "--set train.save_period=N");
  EXPECT_EQ(ForeignSettingInstead("log_period"), "");
}

TEST(ConfigTest, BertFieldsAreChecked) {
  config::Config tiny = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/bert_tiny.prototxt");
  ResolveConfig(&tiny, 4);
  EXPECT_EQ(tiny.model().arch(), "bert");
  EXPECT_EQ(tiny.train().num_accumulation_steps(), 4);
  EXPECT_TRUE(std::filesystem::exists(tiny.data().data_prefix() + ".idx")) << tiny.data().data_prefix();
  EXPECT_EQ(tiny.data().mask_token_id(), 103);
  const std::string bert = "model { arch: \"bert\" vocab_size: 200 } data { data_prefix: \"d\" ";
  std::string e = ResolveError(bert + "mask_token_id: 200 }", 1);
  EXPECT_NE(e.find("data.mask_token_id is 200; expected an id below model.vocab_size 200"), std::string::npos)
      << e;
  e = ResolveError(bert + "pad_token_id: 102 }", 1);
  EXPECT_NE(e.find("data.sep_token_id and data.pad_token_id are both 102"), std::string::npos) << e;
  // The model's padding row is the data's padding token, or none.
  e = ResolveError("model { arch: \"bert\" vocab_size: 200 pad_token_id: 5 } data { data_prefix: \"d\" }", 1);
  EXPECT_NE(e.find("model.pad_token_id is 5 and data.pad_token_id 0"), std::string::npos) << e;
  // -1: no padding row, whatever the data's padding token.
  config::Config no_padding_row = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/bert_tiny.prototxt");
  no_padding_row.mutable_data()->clear_vocab_file();  // whose [PAD] is 0
  no_padding_row.mutable_model()->set_vocab_size(2048);
  no_padding_row.mutable_model()->set_pad_token_id(-1);
  no_padding_row.mutable_data()->set_pad_token_id(7);
  EXPECT_NO_THROW(ResolveConfig(&no_padding_row, 4));
  e = ResolveError(bert + "masked_lm_prob: 0 }", 1);
  EXPECT_NE(e.find("data.masked_lm_prob is 0"), std::string::npos) << e;
  e = ResolveError("model { arch: \"bert\" max_seq_length: 4 } data { data_prefix: \"d\" }", 1);
  EXPECT_NE(e.find("model.max_seq_length is 4; BERT needs at least 5"), std::string::npos) << e;
}

TEST(ConfigTest, TheStandardBertConfigsResolveForEightRanks) {
  struct Expected {
    const char* file;
    int64_t layers, hidden, heads, dp, accumulation;
  };
  for (const Expected& e :
       {Expected{"bert_base", 12, 768, 12, 8, 1}, Expected{"bert_large", 24, 1024, 16, 4, 4}}) {
    SCOPED_TRACE(e.file);
    config::Config c = LoadConfig(std::string(TESSEL_SOURCE_DIR) + "/configs/" + e.file + ".prototxt");
    ResolveConfig(&c, 8);
    EXPECT_EQ(c.model().arch(), "bert");
    EXPECT_EQ(c.model().vocab_size(), 30522);
    EXPECT_EQ(c.model().max_seq_length(), 512);
    EXPECT_EQ(c.model().hidden_layers(), e.layers);
    EXPECT_EQ(c.model().hidden_size(), e.hidden);
    EXPECT_EQ(c.model().num_attention_heads(), e.heads);
    EXPECT_EQ(c.model().ffn_hidden_size(), 4 * e.hidden);
    EXPECT_EQ(c.model().hidden_act(), "gelu");
    EXPECT_EQ(c.train().dist().data_parallel_size(), e.dp);
    EXPECT_EQ(c.train().num_accumulation_steps(), e.accumulation);
  }
}

// model.arch may name a model the program registered (train::RegisterModel):
// its section (model.options, the typed fields it reads) and its data are
// its factory's to check, so the zoo's rules for heads, activations and
// token data do not apply; the zoo's models take no options; an unknown
// name lists the zoo's and the registered ones.
TEST(ConfigTest, RegisteredModelsResolveWithTheirOwnOptions) {
  config::Config own = ParseConfig(
      "model { arch: \"token_mlp\" hidden_size: 100 num_attention_heads: 3 hidden_act: \"relu\" "
      "options { key: \"tied_output\" value: \"true\" } } train { dist { tensor_parallel_size: 2 } }",
      "test");
  ResolveConfig(&own, 2, {"bert", "gpt2", "token_mlp"});
  EXPECT_EQ(own.model().arch(), "token_mlp");
  EXPECT_EQ(own.model().options().at("tied_output"), "true");
  EXPECT_EQ(own.model().ffn_hidden_size(), 400);  // the shared defaults are still filled in
  EXPECT_EQ(own.train().dist().pipeline_num_layers(), own.model().hidden_layers());

  std::string e = ErrorOf([] {
    config::Config c = ParseConfig("model { arch: \"token_mpl\" } data { data_prefix: \"d\" }", "test");
    ResolveConfig(&c, 1, {"bert", "gpt2", "token_mlp"});
  });
  EXPECT_NE(e.find("model.arch is 'token_mpl'; expected one of gpt2, gpt, llama, t5, bert, vit, token_mlp"),
            std::string::npos)
      << e;
  e = ResolveError("model { options { key: \"tied_output\" value: \"true\" } } data { data_prefix: \"d\" }",
                   1);
  EXPECT_NE(e.find("model.options holds 'tied_output', but model.arch 'gpt2' is of the zoo"),
            std::string::npos)
      << e;
  // Shared rules still hold for a registered model.
  e = ErrorOf([] {
    config::Config c = ParseConfig(
        "model { arch: \"token_mlp\" hidden_layers: 1 } train { dist { pipeline_parallel_size: 2 } }",
        "test");
    ResolveConfig(&c, 2, {"token_mlp"});
  });
  EXPECT_NE(e.find("model.hidden_layers 1 is fewer than train.dist.pipeline_parallel_size 2"),
            std::string::npos)
      << e;
  // BERT's best checkpoint may be chosen by any metric its evaluation reports.
  config::Config bert = ParseConfig(
      "model { arch: \"bert\" } data { data_prefix: \"d\" } "
      "train { best_checkpoint_metric: \"eval_mlm_perplexity\" }",
      "test");
  EXPECT_NO_THROW(ResolveConfig(&bert, 1));
}

}  // namespace
}  // namespace tessel::zoo
