#include "layers/module.h"

#include "core/error.h"

namespace tessel::nn {

Tensor& Module::RegisterParameter(const std::string& name, Tensor& t) {
  TESSEL_CHECK(t.defined()) << "parameter '" << name << "' is undefined";
  if (!t.requires_grad()) t.set_requires_grad(true);
  params_.push_back({name, &t});
  return t;
}

Tensor& Module::RegisterBuffer(const std::string& name, Tensor& t) {
  buffers_.push_back({name, &t});
  return t;
}

void Module::RegisterModule(const std::string& name, Module& m) { children_.push_back({name, &m}); }

void Module::RegisterRngCounter(const std::string& name, int64_t& counter) {
  rng_counters_.push_back({name, &counter});
}

void Module::CollectRngCounters(const std::string& prefix,
                                std::vector<std::pair<std::string, int64_t*>>* out) {
  for (auto& [name, c] : rng_counters_) out->push_back({prefix + name, c});
  for (auto& [name, m] : children_) m->CollectRngCounters(prefix + name + ".", out);
}

std::vector<std::pair<std::string, int64_t*>> Module::NamedRngCounters() {
  std::vector<std::pair<std::string, int64_t*>> out;
  CollectRngCounters("", &out);
  return out;
}

void Module::Collect(const std::string& prefix, bool buffers,
                     std::vector<std::pair<std::string, Tensor*>>* out) {
  for (auto& [name, t] : params_) out->push_back({prefix + name, t});
  if (buffers)
    for (auto& [name, t] : buffers_) out->push_back({prefix + name, t});
  for (auto& [name, m] : children_) m->Collect(prefix + name + ".", buffers, out);
}

std::vector<std::pair<std::string, Tensor*>> Module::NamedParameters() {
  std::vector<std::pair<std::string, Tensor*>> out;
  Collect("", false, &out);
  return out;
}

std::vector<Tensor*> Module::Parameters() {
  std::vector<Tensor*> out;
  for (auto& [name, t] : NamedParameters()) out.push_back(t);
  return out;
}

std::map<std::string, Tensor> Module::StateDict() {
  std::vector<std::pair<std::string, Tensor*>> all;
  Collect("", true, &all);
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : all) out[name] = t->detach();
  return out;
}

void Module::ZeroGrad() {
  for (Tensor* t : Parameters()) t->zero_grad();
}

void Module::Train(bool training) {
  training_ = training;
  for (auto& [name, m] : children_) m->Train(training);
}

}  // namespace tessel::nn
