// Training configs: protobuf text files checked against zoo/config.proto,
// command-line overrides, and the sizes one config field implies for
// another (batch sizes, data-parallel size) resolved and checked against the
// world before any work starts.
//
//   config::Config c = zoo::LoadConfig("configs/gpt2_tiny.prototxt");
//   zoo::ApplyOverride(&c, "train.dist.tensor_parallel_size=2");
//   zoo::ResolveConfig(&c, /*world_size=*/4);   // throws naming what disagrees
#pragma once

#include <string>
#include <vector>

#include "zoo/config.pb.h"

namespace tessel::zoo {

// Configs are small; a file beyond this is refused before it is read.
inline constexpr size_t kMaxConfigBytes = 1 << 20;

// Parses `text` (protobuf text format). `source` names it in errors. An
// unknown field is an error naming it, where it is (config path, line and
// column) and the closest known field.
config::Config ParseConfig(const std::string& text, const std::string& source);
// Reads and parses a config file and the files it includes (Config.include:
// at most 16 deep, no cycles). Relative paths in a file (data.data_prefix,
// data.image_dataset, train.load_weight) are made relative to that file's
// directory.
config::Config LoadConfig(const std::string& path);

// `over`'s set fields written onto `base`: messages field by field, lists
// replaced whole, other fields overwritten. How an including config
// overrides what it includes.
void OverrideConfig(config::Config* base, const config::Config& over);

// Applies one override "path.to.field=value" (e.g.
// "train.dist.tensor_parallel_size=2", "train.dist.custom_pipeline_stage_id=[0,0,1]",
// "data.data_prefix=/data/corpus"): the field's value is replaced. An
// unknown path component is an error naming it and the closest field.
void ApplyOverride(config::Config* config, const std::string& assignment);
// Applies a command line's overrides in order, as ApplyOverride does,
// except that a list (repeated or map field) set by several of them gets
// every entry: the first replaces the config's list, the others add to it
// (--set 'f={key:"a" value:"1"}' --set 'f={key:"b" value:"2"}' gives both).
void ApplyOverrides(config::Config* config, const std::vector<std::string>& assignments);
// Takes every `--set path=value` (also --set=path=value; repeatable) out of
// argv, in order, before gflags parses it (gflags keeps only the last of a
// repeated flag). A --set with nothing after it prints how to give one,
// naming `program`, and exits 2.
std::vector<std::string> TakeSetFlags(int* argc, char** argv, const char* program);

// The ranks a config lays out when no launch says: tensor x pipeline x
// data_parallel_size (1 when the config leaves dp to the world). For tools
// that plan or read a job without running it (tessel-plan, tessel-dataset).
// Throws naming the sizes if the product is below 1 or above 2^20.
int WorldSizeOf(const config::DistConfig& dist);

// Fills in every derived size for a job of `world_size` ranks
// (data_parallel_size, pipeline_num_layers, the batch size among micro /
// global / accumulation left out, the defaults of the sub-messages) and
// checks the config: sizes that do not divide the world, batch sizes that
// disagree, model sizes the layout cannot split, unknown names. Throws
// naming the field, its value and what was expected.
//
// `other_models`: the models outside the zoo that the program registered
// (train::ModelNames()), which model.arch may name. Such a model's section
// is its factory's to check (the typed fields it reads, model.options), and
// so is its data; this checks what every model shares: sizes, batch sizes,
// the pipeline's layers, the data fields that are set.
void ResolveConfig(config::Config* config, int world_size, const std::vector<std::string>& other_models = {});

// train.max_duration in seconds: "90s", "45m", "12h", "2d" or a plain
// number of seconds; 0 for "" (no limit). Throws naming the field and the
// value otherwise.
double MaxDurationSeconds(const config::TrainConfig& train);

// The config as protobuf text (what tessel-train saves as config.prototxt).
std::string ConfigText(const config::Config& config);

// train.dist.sequence_parallel with sequence_parallel_mode all_to_all
// (DeepSpeed-Ulysses over the data-parallel ranks); Megatron's is the rest
// of sequence_parallel.
bool AllToAllSequenceParallel(const config::DistConfig& dist);
// train.dist.sequence_parallel with sequence_parallel_mode context (keys
// and values gathered over the data-parallel ranks in each attention).
bool ContextParallel(const config::DistConfig& dist);
// Either of the two: the data-parallel ranks split sequences, not rows.
bool SequencesSplitOverDataParallel(const config::DistConfig& dist);
// sequence_parallel with sequence_parallel_mode megatron (over tp).
bool MegatronSequenceParallel(const config::DistConfig& dist);

// model.arch with its aliases resolved ("gpt" is "gpt2"): what ResolveConfig
// writes, and what checkpoints of one model are compared by.
std::string CanonicalArch(const std::string& arch);

// The name among `candidates` closest to `name` by edit distance, or "" if
// none is close enough to be a likely typo.
std::string ClosestName(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace tessel::zoo
