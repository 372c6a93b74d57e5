#include "layers/module.h"

#include "core/error.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

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

void Module::RegisterRngCounter(const std::string& name, RngCounter& counter) {
  rng_counters_.push_back({name, &counter});
}

void Module::CollectRngCounters(const std::string& prefix,
                                std::vector<std::pair<std::string, RngCounter*>>* out) {
  for (auto& [name, c] : rng_counters_) out->push_back({prefix + name, c});
  for (auto& [name, m] : children_) m->CollectRngCounters(prefix + name + ".", out);
}

std::vector<std::pair<std::string, RngCounter*>> Module::NamedRngCounters() {
  std::vector<std::pair<std::string, RngCounter*>> out;
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

int64_t RngCounter::Get() const {
  if (!tensor_.defined()) return host_;
  Tensor here = tensor_;
  if (here.is_global()) {
    const Placement world = WorldPlacement(here.placement().device_type());
    here = here.to_global(world, NdSbp(std::vector<Sbp>(world.ndim(), B()))).to_local();
  }
  return here.To(Device::CPU()).data<int64_t>()[0];
}

void RngCounter::Set(int64_t value) {
  host_ = value;
  if (tensor_.defined()) WriteInt64(tensor_, value);
}

const Tensor& RngCounter::TensorBeside(const Tensor& x) {
  if (!tensor_.defined()) return tensor_ = ReplicatedInt64(host_, x);
  const bool same = x.is_global() ? tensor_.is_global() && tensor_.placement() == x.placement()
                                  : !tensor_.is_global() && tensor_.device() == x.device();
  TESSEL_CHECK(same) << "a random-stream counter made beside "
                     << (tensor_.is_global() ? tensor_.placement().ToString() : tensor_.device().ToString())
                     << " is asked for draws beside " << x.ToString()
                     << "; a layer that draws masks (Dropout) serves one placement: give each its own";
  return tensor_;
}

}  // namespace tessel::nn
