#include "ops/op_def.h"

#include <mutex>
#include <sstream>

#include "core/error.h"

namespace tessel {

namespace {
std::map<std::string, OpDef>& Registry() {
  static auto* registry = new std::map<std::string, OpDef>();
  return *registry;
}
std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}

struct AttrPrinter {
  std::ostream& os;
  void operator()(bool v) const { os << (v ? "true" : "false"); }
  void operator()(int64_t v) const { os << v; }
  void operator()(double v) const { os << v; }
  void operator()(const std::string& v) const { os << '"' << v << '"'; }
  void operator()(const std::vector<int64_t>& v) const {
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    os << "]";
  }
};
}  // namespace

GlobalTensorSpec GlobalTensorSpec::Of(const Tensor& t) {
  TESSEL_CHECK(t.is_global()) << "GlobalTensorSpec::Of: the tensor of shape " << t.shape()
                              << " is local; a spec needs a global tensor (placement and NdSbp)";
  return {t.shape(), t.dtype(), t.placement(), t.nd_sbp()};
}

template <typename T>
const T& Attrs::Get(const std::string& name) const {
  auto it = values_.find(name);
  TESSEL_CHECK(it != values_.end()) << "missing attribute '" << name << "' (have " << ToString() << ")";
  const T* v = std::get_if<T>(&it->second);
  TESSEL_CHECK(v != nullptr) << "attribute '" << name << "' has another type than requested (have "
                             << ToString() << ")";
  return *v;
}
template const bool& Attrs::Get<bool>(const std::string&) const;
template const int64_t& Attrs::Get<int64_t>(const std::string&) const;
template const double& Attrs::Get<double>(const std::string&) const;
template const std::vector<int64_t>& Attrs::Get<std::vector<int64_t>>(const std::string&) const;
template const std::string& Attrs::Get<std::string>(const std::string&) const;

Attrs Attrs::Only(const std::vector<std::string>& names) const {
  Attrs out;
  for (const std::string& n : names) {
    auto it = values_.find(n);
    if (it != values_.end()) out.values_.emplace(n, it->second);
  }
  return out;
}

std::string Attrs::ToString() const {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (const auto& [k, v] : values_) {
    os << (first ? "" : ", ") << k << "=";
    std::visit(AttrPrinter{os}, v);
    first = false;
  }
  return os.str() + "}";
}

std::string SbpSignature::ToString() const {
  std::ostringstream os;
  for (size_t i = 0; i < inputs.size(); ++i) os << (i ? ", " : "") << inputs[i];
  os << " -> ";
  for (size_t i = 0; i < outputs.size(); ++i) os << (i ? ", " : "") << outputs[i];
  return os.str();
}

void RegisterOp(OpDef def) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  TESSEL_CHECK_CODE(!Registry().count(def.name), StatusCode::kAlreadyExists)
      << "op '" << def.name << "' is registered twice";
  if (!def.mutates.empty()) {
    TESSEL_CHECK(def.num_outputs == static_cast<int>(def.mutates.size()) && !def.grad)
        << "op '" << def.name << "' updates " << def.mutates.size()
        << " inputs in place, so it has that many "
        << "outputs (got num_outputs=" << def.num_outputs << ") and no gradient";
    for (int i : def.mutates) {
      TESSEL_CHECK(i >= 0 && (def.variadic || i < static_cast<int>(def.inputs.size())))
          << "op '" << def.name << "': mutated input index " << i << " is not one of its "
          << def.inputs.size() << " inputs";
    }
  }
  std::string name = def.name;
  Registry().emplace(std::move(name), std::move(def));
}

void RegisterAllOps();  // ops/defs/all_ops.cc

namespace {
void EnsureRegistered() {
  static std::once_flag once;
  std::call_once(once, RegisterAllOps);
}
}  // namespace

const OpDef& GetOpDef(const std::string& name) {
  EnsureRegistered();
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(name);
  TESSEL_CHECK_CODE(it != Registry().end(), StatusCode::kNotFound) << "unknown op '" << name << "'";
  return it->second;
}

std::vector<std::string> RegisteredOps() {
  EnsureRegistered();
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<std::string> names;
  for (const auto& [name, def] : Registry()) names.push_back(name);
  return names;
}

}  // namespace tessel
