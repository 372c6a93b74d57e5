#include "parallel/plan_file.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "parallel/plan.pb.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::parallel {

namespace {

namespace pb = google::protobuf;

// 64-bit FNV-1a: stable across builds and platforms (std::hash is not).
class Fnv1a {
 public:
  void Add(const std::string& s) {
    for (unsigned char c : s) {
      hash_ ^= c;
      hash_ *= 0x100000001b3ULL;
    }
    hash_ ^= 0xff;  // separator
    hash_ *= 0x100000001b3ULL;
  }
  std::string Hex() const {
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash_));
    return text;
  }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

class FirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty())
      first_ = "line " + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

std::string ModelFingerprint(const ir::Graph& g) {
  Fnv1a h;
  auto spec = [&](int id) {
    const ir::Value& v = g.value(id);
    return v.name + ":" + std::string(DTypeName(v.dtype)) + v.shape.ToString();
  };
  for (const ir::Value& v : g.values())
    if (v.kind != ir::Value::Kind::kOpOutput) h.Add(spec(v.id));
  for (const ir::Op& op : g.ops()) {
    h.Add(op.name);
    for (int v : op.inputs) h.Add(spec(v));
  }
  return "fnv1a64:" + h.Hex() + ", " + std::to_string(g.ops().size()) + " ops";
}

std::string PlanToText(const ParallelPlan& plan) {
  proto::ParallelPlan p;
  p.set_policy(plan.policy);
  p.set_data_parallel(plan.data_parallel);
  p.set_tensor_parallel(plan.tensor_parallel);
  p.set_stages(plan.stages);
  p.set_micro_batches(plan.micro_batches);
  for (const auto& [name, sbp] : plan.parameter_split) {
    proto::ParameterSplit* s = p.add_parameter_split();
    s->set_parameter(name);
    s->set_axis(sbp.is_split() ? sbp.axis() : -1);
  }
  for (int s : plan.op_stage) p.add_op_stage(s);
  for (const std::string& r : plan.reasons) p.add_reasons(r);
  p.set_model_fingerprint(plan.model_fingerprint);
  p.set_plan_ranks(plan.ranks());
  std::string text;
  pb::TextFormat::PrintToString(p, &text);
  return text;
}

ParallelPlan ParsePlanText(const std::string& text, const std::string& source) {
  TESSEL_CHECK(text.size() <= kMaxPlanFileBytes)
      << "plan " << source << ": " << text.size() << " bytes; a plan is at most " << kMaxPlanFileBytes;
  proto::ParallelPlan p;
  FirstError errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  TESSEL_CHECK(parser.ParseFromString(text, &p))
      << "plan " << source << ": " << (errors.first().empty() ? "not a plan" : errors.first());
  constexpr int64_t kMaxRanks = 1 << 20;
  auto size = [&](const char* field, int64_t v) {
    TESSEL_CHECK(v >= 1 && v <= kMaxRanks)
        << "plan " << source << ": " << field << " is " << v << "; expected 1.." << kMaxRanks;
    return v;
  };
  ParallelPlan plan;
  plan.policy = p.policy();
  plan.data_parallel = size("data_parallel", p.data_parallel());
  plan.tensor_parallel = size("tensor_parallel", p.tensor_parallel());
  plan.stages = size("stages", p.stages());
  plan.micro_batches = static_cast<int>(size("micro_batches", p.micro_batches()));
  TESSEL_CHECK(p.plan_ranks() == plan.data_parallel * plan.tensor_parallel * plan.stages)
      << "plan " << source << ": plan_ranks " << p.plan_ranks()
      << " is not data x tensor x stages = " << plan.data_parallel * plan.tensor_parallel * plan.stages;
  for (const proto::ParameterSplit& s : p.parameter_split()) {
    TESSEL_CHECK(s.axis() >= -1 && s.axis() < 64)
        << "plan " << source << ": parameter '" << s.parameter() << "' split on axis " << s.axis()
        << "; expected -1 (replicated) or a dimension";
    plan.parameter_split[s.parameter()] = s.axis() < 0 ? B() : S(s.axis());
  }
  plan.op_stage.assign(p.op_stage().begin(), p.op_stage().end());
  plan.reasons.assign(p.reasons().begin(), p.reasons().end());
  plan.model_fingerprint = p.model_fingerprint();
  return plan;
}

void SavePlan(const ParallelPlan& plan, const std::string& path) {
  TESSEL_CHECK(!plan.model_fingerprint.empty())
      << "SavePlan: the plan has no model fingerprint (save plans parallelize made: ParallelModule::plan())";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << PlanToText(plan);
    TESSEL_CHECK(out.good()) << "SavePlan: cannot write " << tmp;
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  TESSEL_CHECK(!error) << "SavePlan: cannot move " << tmp << " to " << path << " (" << error.message() << ")";
}

Policy PlanFromFile(const std::string& path) {
  return [path](const PolicyContext& c) {
    std::error_code error;
    const auto bytes = std::filesystem::file_size(path, error);
    TESSEL_CHECK(!error) << "plan " << path << ": cannot read it (" << error.message() << ")";
    TESSEL_CHECK(bytes <= kMaxPlanFileBytes)
        << "plan " << path << ": " << bytes << " bytes; a plan is at most " << kMaxPlanFileBytes;
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    ParallelPlan plan = ParsePlanText(text.str(), path);
    const std::string here = ModelFingerprint(c.graph);
    TESSEL_CHECK(plan.model_fingerprint == here)
        << "plan " << path << " was made for another model or sample batch (" << plan.model_fingerprint
        << "; this one is " << here << "): make a new plan";
    TESSEL_CHECK(plan.ranks() == c.config.plan_ranks)
        << "plan " << path << " spans " << plan.ranks() << " ranks; this job plans " << c.config.plan_ranks;
    plan.reasons.insert(plan.reasons.begin(), "loaded from " + path);
    return plan;
  };
}

}  // namespace tessel::parallel
