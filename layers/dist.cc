#include "layers/dist.h"

#include <glog/logging.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "core/join.h"
#include "core/named_registry.h"
#include "layers/parallel_mode.h"
#include "sbp/global_tensor.h"
#include "sbp/slice.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::dist {

namespace {
Config* g_config = nullptr;
std::vector<std::vector<int>>* g_stage_ranks = nullptr;  // the mode's grids, checked
std::vector<int64_t>* g_tensor_mesh = nullptr;           // the mode's tensor mesh, checked
TensorLayout g_layout = TensorLayout::k1d;

// A named axis, checked: its groups, and per world rank its group and its
// index in it.
struct Axis {
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of, index_of;
};
std::map<std::string, Axis>* g_axes = nullptr;

const Config& Current() {
  TESSEL_CHECK(g_config != nullptr) << "dist::Setup has not been called";
  return *g_config;
}

// Indexes `groups` by rank; throws (naming `what`) unless they split the
// world's ranks into groups of one size.
Axis IndexedAxis(std::vector<std::vector<int>> groups, int world, const std::string& what) {
  TESSEL_CHECK(!groups.empty() && !groups.front().empty())
      << what << " has no ranks; expected groups that hold every rank of the world of " << world << " once";
  Axis axis{.groups = std::move(groups),
            .group_of = std::vector<int>(static_cast<size_t>(world), -1),
            .index_of = std::vector<int>(static_cast<size_t>(world), -1)};
  for (size_t g = 0; g < axis.groups.size(); ++g) {
    const std::vector<int>& ranks = axis.groups[g];
    TESSEL_CHECK(ranks.size() == axis.groups.front().size())
        << what << ": group " << g << " [" << Join(ranks) << "] has " << ranks.size() << " ranks, group 0 ["
        << Join(axis.groups.front()) << "] " << axis.groups.front().size() << "; expected groups of one size";
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int r = ranks[i];
      TESSEL_CHECK(r >= 0 && r < world)
          << what << ": group " << g << " holds rank " << r << ", outside the world of " << world;
      TESSEL_CHECK(axis.group_of[static_cast<size_t>(r)] < 0)
          << what << ": rank " << r << " is in group " << axis.group_of[static_cast<size_t>(r)]
          << " and again in group " << g << "; expected each rank in one group";
      axis.group_of[static_cast<size_t>(r)] = static_cast<int>(g);
      axis.index_of[static_cast<size_t>(r)] = static_cast<int>(i);
    }
  }
  const auto missing = std::find(axis.group_of.begin(), axis.group_of.end(), -1);
  TESSEL_CHECK(missing == axis.group_of.end())
      << what << ": rank " << (missing - axis.group_of.begin())
      << " is in no group; expected every rank of the world of " << world;
  return axis;
}

// dp, tp and pp from the stages' [dp, tp] grids, and the axes of a
// multi-axis tensor mesh (tp index row-major over it).
std::map<std::string, std::vector<std::vector<int>>> BuiltInAxes(
    const std::vector<std::vector<int>>& stage_ranks, int64_t dp, int64_t tp,
    const std::vector<int64_t>& tensor_mesh) {
  std::map<std::string, std::vector<std::vector<int>>> axes;
  for (const std::vector<int>& ranks : stage_ranks) {
    for (int64_t t = 0; t < tp; ++t) {
      std::vector<int>& group = axes["dp"].emplace_back();
      for (int64_t d = 0; d < dp; ++d) group.push_back(ranks[static_cast<size_t>(d * tp + t)]);
    }
    for (int64_t d = 0; d < dp; ++d)
      axes["tp"].emplace_back(ranks.begin() + d * tp, ranks.begin() + (d + 1) * tp);
  }
  for (int64_t i = 0; i < dp * tp; ++i) {
    std::vector<int>& group = axes["pp"].emplace_back();
    for (const std::vector<int>& ranks : stage_ranks) group.push_back(ranks[static_cast<size_t>(i)]);
  }
  if (tensor_mesh.size() > 1) {
    int64_t stride = tp;
    for (size_t k = 0; k < tensor_mesh.size(); ++k) {
      stride /= tensor_mesh[k];  // of axis k's index in the row-major tp index
      std::vector<std::vector<int>>& groups = axes["tp" + std::to_string(k)];
      for (const std::vector<int>& ranks : stage_ranks)
        for (int64_t d = 0; d < dp; ++d)
          for (int64_t t = 0; t < tp; ++t) {
            if ((t / stride) % tensor_mesh[k] != 0) continue;  // a group starts at index 0 along k
            std::vector<int>& group = groups.emplace_back();
            for (int64_t j = 0; j < tensor_mesh[k]; ++j)
              group.push_back(ranks[static_cast<size_t>(d * tp + t + j * stride)]);
          }
    }
  }
  return axes;
}

// dp, tp, pp, and tp0, tp1, ... (a tensor mesh's axes).
bool IsBuiltInAxisName(const std::string& name) {
  if (name == "dp" || name == "tp" || name == "pp") return true;
  return name.size() > 2 && name.rfind("tp", 0) == 0 &&
         std::all_of(name.begin() + 2, name.end(),
                     [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); });
}

const Axis& FindAxis(const std::string& name) {
  TESSEL_CHECK(g_axes != nullptr) << "dist::Setup has not been called";
  const auto it = g_axes->find(name);
  if (it != g_axes->end()) return it->second;
  TESSEL_THROW(StatusCode::kInvalidArgument)
      << "axis '" << name << "' is not defined; the axes are " << Join(AxisNames(), ", ")
      << " (a parallel mode adds its own with ParallelMode::axes)";
}

}  // namespace

void Setup(const Config& in) {
  Config c = in;
  const int64_t world = CurrentWorldSize();
  TESSEL_CHECK(c.tensor_parallel_size >= 1 && c.pipeline_parallel_size >= 1)
      << "tensor_parallel_size=" << c.tensor_parallel_size
      << " and pipeline_parallel_size=" << c.pipeline_parallel_size << " must be >= 1";
  const int64_t tp_pp = c.tensor_parallel_size * c.pipeline_parallel_size;
  TESSEL_CHECK(world % tp_pp == 0) << "tensor_parallel_size=" << c.tensor_parallel_size
                                   << " x pipeline_parallel_size=" << c.pipeline_parallel_size << " = "
                                   << tp_pp << " does not divide the world size " << world;
  const int64_t dp = world / tp_pp;
  TESSEL_CHECK(c.data_parallel_size == 0 || c.data_parallel_size == dp)
      << "data_parallel_size=" << c.data_parallel_size << " disagrees with world " << world << " / (tp "
      << c.tensor_parallel_size << " x pp " << c.pipeline_parallel_size << ") = " << dp
      << "; leave it 0 to derive it";
  c.data_parallel_size = dp;
  TESSEL_CHECK(c.virtual_pipeline_size >= 1 && (c.virtual_pipeline_size == 1 || c.pipeline_parallel_size > 1))
      << "virtual_pipeline_size=" << c.virtual_pipeline_size
      << " with pipeline_parallel_size=" << c.pipeline_parallel_size
      << "; expected 1, or more model chunks per stage of a pipeline of 2 or more stages";
  // Parts of the model in pipeline order: the stages, or their chunks.
  const int64_t parts = c.pipeline_parallel_size * c.virtual_pipeline_size;
  const std::string part = c.virtual_pipeline_size > 1 ? "virtual stage" : "stage";
  if (!c.custom_pipeline_stage_ids.empty()) {
    TESSEL_CHECK(c.pipeline_num_layers == 0 ||
                 c.pipeline_num_layers == static_cast<int64_t>(c.custom_pipeline_stage_ids.size()))
        << "custom_pipeline_stage_ids has " << c.custom_pipeline_stage_ids.size()
        << " entries but pipeline_num_layers=" << c.pipeline_num_layers
        << "; expected one stage id per layer";
    c.pipeline_num_layers = static_cast<int64_t>(c.custom_pipeline_stage_ids.size());
    for (size_t i = 0; i < c.custom_pipeline_stage_ids.size(); ++i) {
      int64_t s = c.custom_pipeline_stage_ids[i];
      TESSEL_CHECK(s >= 0 && s < parts) << "custom_pipeline_stage_ids[" << i << "]=" << s << " is not a "
                                        << part << " (0.." << parts - 1 << ")";
      // Layer i reads layer i-1's output: a lower stage would send
      // activations backwards, against the pipeline's flow.
      TESSEL_CHECK(i == 0 || s >= c.custom_pipeline_stage_ids[i - 1])
          << "custom_pipeline_stage_ids[" << i << "]=" << s << " puts layer " << i << " on an earlier "
          << part << " than layer " << i - 1 << " (" << part << " " << c.custom_pipeline_stage_ids[i - 1]
          << "): its forward would flow back to an earlier " << part
          << "; expected stage ids that never decrease";
    }
    for (int64_t s = 0; s < parts; ++s) {
      TESSEL_CHECK(std::find(c.custom_pipeline_stage_ids.begin(), c.custom_pipeline_stage_ids.end(), s) !=
                   c.custom_pipeline_stage_ids.end())
          << "custom_pipeline_stage_ids [" << Join(c.custom_pipeline_stage_ids) << "] give " << part << " "
          << s << " no layers; expected every " << part << " 0.." << parts - 1 << " to hold one or more";
    }
  }
  TESSEL_CHECK(c.sequence_parallel + c.all_to_all_sequence_parallel + c.context_parallel <= 1)
      << "sequence_parallel (Megatron's, over tp), all_to_all_sequence_parallel and context_parallel (over "
         "dp) "
         "are one or another";
  TESSEL_CHECK(!(c.all_to_all_sequence_parallel || c.context_parallel) || dp > 1)
      << (c.context_parallel ? "context_parallel" : "all_to_all_sequence_parallel")
      << " splits sequences over the data-parallel ranks, but data_parallel_size is " << dp;
  TESSEL_CHECK(c.zero_stage >= 0 && c.zero_stage <= 3)
      << "zero_stage=" << c.zero_stage << "; expected 0 (off), 1, 2 or 3";
  TESSEL_CHECK(c.pipeline_parallel_size == 1 || c.pipeline_num_layers >= parts)
      << "pipeline_parallel_size=" << c.pipeline_parallel_size
      << (c.virtual_pipeline_size > 1
              ? " x virtual_pipeline_size=" + std::to_string(c.virtual_pipeline_size) +
                    " needs pipeline_num_layers >= " + std::to_string(parts) +
                    " (a layer or more per virtual stage)"
              : std::string(" needs pipeline_num_layers >= the stage count"))
      << "; got " << c.pipeline_num_layers;
  // The mode's grids: stage s gets dp x tp ranks, every rank of the world once.
  const ParallelMode mode = FindParallelMode(c.tensor_parallel_mode);
  const ParallelModeSizes sizes{.world_size = world,
                                .data_parallel_size = dp,
                                .tensor_parallel_size = c.tensor_parallel_size,
                                .pipeline_parallel_size = c.pipeline_parallel_size,
                                .options = c.tensor_parallel_mode_options};
  if (mode.check) mode.check(sizes);
  std::vector<std::vector<int>> stage_ranks = mode.stage_ranks(sizes);
  TESSEL_CHECK(static_cast<int64_t>(stage_ranks.size()) == c.pipeline_parallel_size)
      << "tensor_parallel_mode '" << c.tensor_parallel_mode << "' formed " << stage_ranks.size()
      << " stages; expected pipeline_parallel_size=" << c.pipeline_parallel_size;
  std::vector<int> seen_in(static_cast<size_t>(world), -1);
  for (size_t s = 0; s < stage_ranks.size(); ++s) {
    TESSEL_CHECK(static_cast<int64_t>(stage_ranks[s].size()) == dp * c.tensor_parallel_size)
        << "tensor_parallel_mode '" << c.tensor_parallel_mode << "' gave stage " << s << " the ranks ["
        << Join(stage_ranks[s]) << "]; expected dp " << dp << " x tp " << c.tensor_parallel_size
        << " of them";
    for (int r : stage_ranks[s]) {
      TESSEL_CHECK(r >= 0 && r < world)
          << "tensor_parallel_mode '" << c.tensor_parallel_mode << "' gave stage " << s << " rank " << r
          << ", outside the world of " << world;
      TESSEL_CHECK(seen_in[static_cast<size_t>(r)] < 0)
          << "tensor_parallel_mode '" << c.tensor_parallel_mode << "' gave rank " << r << " to stage "
          << seen_in[static_cast<size_t>(r)] << " and again to stage " << s << "; expected each rank once";
      seen_in[static_cast<size_t>(r)] = static_cast<int>(s);
    }
  }
  std::vector<int64_t> tensor_mesh = {c.tensor_parallel_size};
  if (mode.tensor_mesh) tensor_mesh = mode.tensor_mesh(sizes);
  int64_t mesh_size = 1;
  for (int64_t n : tensor_mesh) mesh_size *= n;
  TESSEL_CHECK(mesh_size == c.tensor_parallel_size && !tensor_mesh.empty())
      << "tensor_parallel_mode '" << c.tensor_parallel_mode << "' gave the tensor mesh [" << Join(tensor_mesh)
      << "]; expected axes whose product is tensor_parallel_size=" << c.tensor_parallel_size;
  if (mode.layout != TensorLayout::k1d) {
    // Megatron's sequence parallelism splits 1d's replicated hidden states;
    // the multi-axis layouts already split them over every tp rank.
    TESSEL_CHECK(!c.sequence_parallel)
        << "sequence_parallel (Megatron's) works with tensor_parallel_mode '1d'; '" << c.tensor_parallel_mode
        << "' already splits the hidden states over all " << c.tensor_parallel_size
        << " tensor-parallel ranks";
    TESSEL_CHECK(!c.all_to_all_sequence_parallel && !c.context_parallel)
        << (c.context_parallel ? "context" : "all-to-all sequence")
        << " parallelism works with tensor_parallel_mode '1d', not '" << c.tensor_parallel_mode << "'";
  }
  // Named axes: the built-in ones, then the mode's (checked, new names).
  std::map<std::string, Axis> axes;
  for (auto& [name, groups] : BuiltInAxes(stage_ranks, dp, c.tensor_parallel_size, tensor_mesh))
    axes[name] = IndexedAxis(std::move(groups), static_cast<int>(world), "axis '" + name + "'");
  if (mode.axes) {
    for (NamedAxis& a : mode.axes(sizes)) {
      const std::string what = "tensor_parallel_mode '" + c.tensor_parallel_mode + "' axis '" + a.name + "'";
      TESSEL_CHECK(IsRegistryName(a.name)) << what << ": expected a name of letters, digits, '_', '-' or '.'";
      TESSEL_CHECK(!IsBuiltInAxisName(a.name))
          << what << ": dp, tp, pp and tp0, tp1, ... are built in; expected a name of the mode's own";
      TESSEL_CHECK(axes.count(a.name) == 0) << what << " is given twice; expected each axis once";
      axes[a.name] = IndexedAxis(std::move(a.groups), static_cast<int>(world), what);
    }
  }
  delete g_axes;
  g_axes = new std::map<std::string, Axis>(std::move(axes));
  delete g_config;
  g_config = new Config(c);
  delete g_tensor_mesh;
  g_tensor_mesh = new std::vector<int64_t>(std::move(tensor_mesh));
  g_layout = mode.layout;
  delete g_stage_ranks;
  g_stage_ranks = new std::vector<std::vector<int>>(std::move(stage_ranks));
}

std::vector<std::string> LayoutLines() {
  const Config& c = GetConfig();
  std::vector<std::string> lines;
  if (c.pipeline_parallel_size > 1) lines.push_back("pipeline: " + LayerAssignmentText());
  if (c.tensor_parallel_mode != "1d")
    lines.push_back("tensor_parallel_mode " + c.tensor_parallel_mode + " (tensor mesh [" +
                    Join(*g_tensor_mesh, " x ") + "]): " + StageGridText());
  // The axes the mode added.
  for (const auto& [name, axis] : *g_axes) {
    if (IsBuiltInAxisName(name)) continue;
    std::ostringstream os;
    os << "axis " << name << " (" << c.tensor_parallel_mode << "):";
    for (const std::vector<int>& group : axis.groups) os << " [" << Join(group, " ") << "]";
    lines.push_back(os.str());
  }
  return lines;
}

std::string LayerAssignmentText() {
  const Config& c = Current();
  const std::vector<int64_t> layer_stages = LayerStages();
  const std::vector<std::vector<int>> stage_ranks = StageRanks();
  std::ostringstream os;
  os << layer_stages.size() << " layers on " << c.pipeline_parallel_size << " stages";
  if (c.virtual_pipeline_size > 1) os << " of " << c.virtual_pipeline_size << " chunks";
  os << ":";
  for (size_t s = 0; s < stage_ranks.size(); ++s) {
    // Contiguous ranks as a range; a mode's other grids in full.
    const std::vector<int>& ranks = stage_ranks[s];
    bool contiguous = true;
    for (size_t i = 1; i < ranks.size(); ++i) contiguous &= ranks[i] == ranks[i - 1] + 1;
    os << (s ? ";" : "") << " stage " << s << " (ranks ";
    if (contiguous)
      os << ranks.front() << ".." << ranks.back();
    else
      os << "[" << Join(ranks) << "]";
    os << "): ";
    // Each chunk's run of layers (one chunk: the stage's).
    std::vector<std::string> runs;
    size_t count = 0;
    for (int64_t chunk = 0; chunk < c.virtual_pipeline_size; ++chunk) {
      const int64_t part = chunk * c.pipeline_parallel_size + static_cast<int64_t>(s);
      std::vector<int64_t> layers;
      for (size_t l = 0; l < layer_stages.size(); ++l)
        if (layer_stages[l] == part) layers.push_back(static_cast<int64_t>(l));
      if (layers.empty()) continue;
      count += layers.size();
      runs.push_back(layers.size() == 1
                         ? std::to_string(layers[0])
                         : std::to_string(layers.front()) + ".." + std::to_string(layers.back()));
    }
    if (runs.empty())
      os << "no layers";
    else
      os << (count == 1 ? "layer " : "layers ") << Join(runs, ", ");
  }
  return os.str();
}

std::string StageGridText() {
  const Config& c = Current();
  std::ostringstream os;
  for (size_t s = 0; s < g_stage_ranks->size(); ++s) {
    os << (s ? "; " : "") << "stage " << s << " [dp x tp] = [";
    const std::vector<int>& ranks = (*g_stage_ranks)[s];
    for (size_t i = 0; i < ranks.size(); ++i) {
      const bool row_start = i % static_cast<size_t>(c.tensor_parallel_size) == 0;
      os << (row_start ? (i ? "] [" : "[") : " ") << ranks[i];
    }
    os << "]]";
  }
  return os.str();
}

const Config& GetConfig() { return Current(); }
int Rank() { return CurrentRank(); }
int WorldSize() { return CurrentWorldSize(); }

int64_t GetLayerVirtualStageId(int64_t layer_idx) {
  const Config& c = Current();
  const int64_t layers = std::max<int64_t>(c.pipeline_num_layers, 1);
  if (layer_idx == -1) layer_idx = layers - 1;
  TESSEL_CHECK(layer_idx >= 0 && layer_idx < layers)
      << "layer_idx " << layer_idx << " is out of range; expected -1 or 0.." << layers - 1
      << " (pipeline_num_layers=" << c.pipeline_num_layers << ")";
  if (!c.custom_pipeline_stage_ids.empty()) return c.custom_pipeline_stage_ids[layer_idx];
  // Balanced: part j takes a contiguous run of layers, larger runs first.
  const int64_t parts = c.pipeline_parallel_size * c.virtual_pipeline_size;
  for (int64_t j = 0; j < parts; ++j) {
    if (layer_idx < BalancedPart({0, layers}, parts, j).end) return j;
  }
  return parts - 1;
}

int64_t GetLayerStageId(int64_t layer_idx) {
  return GetLayerVirtualStageId(layer_idx) % Current().pipeline_parallel_size;
}

Placement GetLayerPlacement(int64_t layer_idx) {
  const Config& c = Current();
  std::vector<int> ranks = StageRanks()[static_cast<size_t>(GetLayerStageId(layer_idx))];
  std::vector<int64_t> hierarchy;
  if (c.data_parallel_size > 1) hierarchy.push_back(c.data_parallel_size);
  for (int64_t n : *g_tensor_mesh)
    if (n > 1) hierarchy.push_back(n);
  if (hierarchy.empty()) hierarchy.push_back(1);
  return Placement(c.device_type, ranks, hierarchy);
}

std::vector<std::vector<int>> StageRanks() {
  Current();
  return *g_stage_ranks;
}

std::vector<std::string> AxisNames() {
  TESSEL_CHECK(g_axes != nullptr) << "dist::Setup has not been called";
  std::vector<std::string> names;
  for (const auto& [name, axis] : *g_axes) names.push_back(name);
  return names;
}

int64_t AxisSize(const std::string& axis) {
  return static_cast<int64_t>(FindAxis(axis).groups.front().size());
}

namespace {
int CheckedRank(const Axis& axis, const std::string& name, int rank) {
  const int r = rank < 0 ? Rank() : rank;
  TESSEL_CHECK(r >= 0 && static_cast<size_t>(r) < axis.group_of.size())
      << "axis '" << name << "': rank " << r << " is outside the world of " << axis.group_of.size();
  return r;
}
}  // namespace

int64_t AxisRank(const std::string& axis, int rank) {
  const Axis& a = FindAxis(axis);
  return a.index_of[static_cast<size_t>(CheckedRank(a, axis, rank))];
}

std::vector<int> AxisGroup(const std::string& axis, int rank) {
  const Axis& a = FindAxis(axis);
  return a.groups[static_cast<size_t>(a.group_of[static_cast<size_t>(CheckedRank(a, axis, rank))])];
}

std::vector<int64_t> LayerStages() {
  std::vector<int64_t> stages;
  for (int64_t l = 0; l < std::max<int64_t>(Current().pipeline_num_layers, 1); ++l)
    stages.push_back(GetLayerVirtualStageId(l));
  return stages;
}

std::vector<int64_t> TensorMesh() {
  Current();
  return *g_tensor_mesh;
}

TensorLayout GetTensorLayout() {
  Current();
  return g_layout;
}

bool MultiAxisTensorParallel() { return GetTensorLayout() != TensorLayout::k1d; }

NdSbp GetNdSbp(const std::vector<Sbp>& dp_tp) {
  TESSEL_CHECK(dp_tp.size() == 2) << "GetNdSbp takes the [dp, tp] pair, got " << dp_tp.size() << " entries";
  Current();
  TESSEL_CHECK(g_tensor_mesh->size() == 1 || !dp_tp[1].is_split())
      << "GetNdSbp({" << dp_tp[0] << ", " << dp_tp[1]
      << "}): a split over tp names no axis of tensor_parallel_mode '" << Current().tensor_parallel_mode
      << "' (tensor mesh [" << Join(*g_tensor_mesh) << "]); use dist::MeshSbp or the mode's layouts";
  return MeshSbp(dp_tp[0], std::vector<Sbp>(g_tensor_mesh->size(), dp_tp[1]));
}

NdSbp MeshSbp(const Sbp& dp, const std::vector<Sbp>& tensor_axes) {
  const Config& c = Current();
  TESSEL_CHECK(tensor_axes.size() == g_tensor_mesh->size())
      << "MeshSbp: " << tensor_axes.size() << " tensor-parallel entries for the tensor mesh ["
      << Join(*g_tensor_mesh) << "]";
  std::vector<Sbp> out;
  if (c.data_parallel_size > 1) out.push_back(dp);
  for (size_t i = 0; i < tensor_axes.size(); ++i)
    if ((*g_tensor_mesh)[i] > 1) out.push_back(tensor_axes[i]);
  if (out.empty()) {
    // One process: a partial entry survives (the value is still a sum).
    Sbp kept = dp.is_partial() ? dp : B();
    for (const Sbp& s : tensor_axes)
      if (!kept.is_partial() && s.is_partial()) kept = s;
    out.push_back(kept);
  }
  return NdSbp(out);
}

LinearLayouts MultiAxisLinearLayouts(bool column, bool data, int64_t ndim) {
  const TensorLayout layout = GetTensorLayout();
  TESSEL_CHECK(layout != TensorLayout::k1d) << "MultiAxisLinearLayouts under tensor_parallel_mode '1d'";
  const Sbp dp = DataParallelSbp();
  const Sbp L = S(static_cast<int>(ndim - 1));
  auto mesh = [&](const std::vector<Sbp>& axes) { return MeshSbp(dp, axes); };
  auto param = [&](const std::vector<Sbp>& axes) { return MeshSbp(B(), axes); };
  if (data) {
    // The batch splits of the hidden states kept, the features whole.
    const std::vector<Sbp> batch = layout == TensorLayout::k2d     ? std::vector<Sbp>{S(0), B()}
                                   : layout == TensorLayout::k2p5d ? std::vector<Sbp>{S(0), S(0), B()}
                                                                   : std::vector<Sbp>{B(), B(), S(0)};
    const NdSbp x = mesh(batch), replicated = param(std::vector<Sbp>(batch.size(), B()));
    return {x, x, replicated, replicated, x, replicated};
  }
  switch (layout) {
    case TensorLayout::k2d:
      return {mesh({S(0), L}),    mesh({S(0), B()}), param({S(0), S(1)}),
              param({B(), S(1)}), mesh({S(0), L}),   param({B(), S(0)})};
    case TensorLayout::k2p5d:
      return {mesh({S(0), S(0), L}),   mesh({S(0), S(0), B()}), param({B(), S(0), S(1)}),
              param({B(), B(), S(1)}), mesh({S(0), S(0), L}),   param({B(), B(), S(0)})};
    case TensorLayout::k3d:
      TESSEL_CHECK(ndim >= 3)
          << "tensor_parallel_mode '3d': a column- or row-parallel Linear needs [batch, seq, "
             "features] inputs (the sequence is split); got "
          << ndim << " dimensions";
      if (column)
        return {mesh({L, S(1), S(0)}),    mesh({L, B(), S(0)}),  param({S(0), S(1), S(0)}),
                param({S(0), S(1), B()}), mesh({S(1), L, S(0)}), param({B(), S(0), B()})};
      return {mesh({S(1), L, S(0)}),    mesh({B(), L, S(0)}),  param({S(1), S(0), S(0)}),
              param({S(1), S(0), B()}), mesh({L, S(1), S(0)}), param({S(0), B(), B()})};
    case TensorLayout::k1d:
      break;
  }
  TESSEL_THROW(StatusCode::kInternal) << "unknown tensor layout";
}

EmbeddingLayouts MultiAxisEmbeddingLayouts() {
  const LinearLayouts col = MultiAxisLinearLayouts(/*column=*/true, /*data=*/false, /*ndim=*/3);
  // W [H, V] as the table [V, H]: every split of a dimension moves to the other.
  auto transposed = [](const NdSbp& w) {
    std::vector<Sbp> sbps = w.sbps();
    for (Sbp& s : sbps)
      if (s.is_split()) s = S(1 - s.axis());
    return NdSbp(sbps);
  };
  // The ids [batch, seq]: the batch splits of the hidden states (those of
  // a data-parallel layer's input).
  const std::vector<Sbp> ids = MultiAxisLinearLayouts(false, /*data=*/true, 2).input.sbps();
  return {transposed(col.weight), transposed(col.weight_compute), NdSbp(ids)};
}

NdSbp AttentionKeySbp(const NdSbp& nd_sbp) {
  std::vector<Sbp> sbps = nd_sbp.sbps();
  for (Sbp& s : sbps)
    if (s.is_split(2)) s = B();
  return NdSbp(sbps);
}

int64_t ColumnFeatureParts() {
  const std::vector<int64_t> mesh = TensorMesh();
  switch (GetTensorLayout()) {
    case TensorLayout::k1d:
      return Current().tensor_parallel_size;
    case TensorLayout::k2d:
    case TensorLayout::k2p5d:
      return mesh.back();
    case TensorLayout::k3d:
      return mesh[1];
  }
  return 1;
}

NdSbp FeatureParameterSbp(const NdSbp& activation, int64_t ndim) {
  std::vector<Sbp> sbps = activation.sbps();
  for (Sbp& s : sbps) s = s.is_split(static_cast<int>(ndim - 1)) ? S(0) : B();
  return NdSbp(sbps);
}

bool SequencesSplitOverDataParallel() {
  return Current().all_to_all_sequence_parallel || Current().context_parallel;
}

Sbp DataParallelSbp() { return SequencesSplitOverDataParallel() ? S(1) : S(0); }

NdSbp GetHiddenSbp() { return GetNdSbp({DataParallelSbp(), B()}); }

NdSbp BatchInputSbp(int64_t ndim) {
  const bool tokens = ndim == 2 || ndim == 3;
  return SequencesSplitOverDataParallel() && !tokens ? GetNdSbp({B(), B()}) : GetHiddenSbp();
}

NdSbp GetActivationSbp(int64_t ndim) {
  if (MultiAxisTensorParallel() && ndim >= 3) return MultiAxisLinearLayouts(true, false, ndim).input;
  if (MultiAxisTensorParallel() && ndim == 2) {
    // [rows, features] (no sequence): the features split as in [b, s, h].
    std::vector<Sbp> sbps = MultiAxisLinearLayouts(true, false, 3).input.sbps();
    for (Sbp& s : sbps) s = s.is_split(2) ? S(1) : s.is_split(1) ? B() : s;
    return NdSbp(sbps);
  }
  return GetNdSbp({DataParallelSbp(), Current().sequence_parallel && ndim >= 3 ? S(1) : B()});
}

NdSbp ZeroShardSbp(const Shape& shape, const NdSbp& nd_sbp) {
  const Config& c = Current();
  // The dp axis is the placement's first when dp > 1 (GetLayerPlacement).
  if (c.data_parallel_size <= 1 || nd_sbp.size() == 0 || !nd_sbp[0].is_broadcast()) return nd_sbp;
  for (int64_t d = 0; d < shape.ndim(); ++d) {
    bool split_elsewhere = false;
    for (int axis = 1; axis < nd_sbp.size(); ++axis)
      split_elsewhere |= nd_sbp[axis].is_split(static_cast<int>(d));
    if (split_elsewhere || shape[d] < c.data_parallel_size) continue;
    std::vector<Sbp> sbps = nd_sbp.sbps();
    sbps[0] = S(static_cast<int>(d));
    return NdSbp(sbps);
  }
  return nd_sbp;
}

NdSbp GetParameterNdSbp(const Shape& shape, const Sbp& tp) {
  return GetParameterNdSbp(shape, GetNdSbp({B(), tp}));
}

NdSbp GetParameterNdSbp(const Shape& shape, const NdSbp& replicated) {
  return Current().zero_stage >= 3 ? ZeroShardSbp(shape, replicated) : replicated;
}

}  // namespace tessel::dist
