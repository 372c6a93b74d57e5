// nn::Module: named parameters, buffers and submodules, train/eval.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tessel::nn {

// Where a module's random stream stands: how far its masks have drawn. A
// checkpoint saves it, so a resumed run draws the masks the uninterrupted
// run would have. Masks made on the host count here (host()); a layer whose
// masks are drawn on the device keeps the count in an i64 scalar tensor
// beside the tensor it draws for (TensorBeside), which the ops advance — in
// a captured step too, where the tensor is a variable the graph holds.
class RngCounter {
 public:
  // The count. A global counter tensor is read through a broadcast over the
  // world, so every rank calls this, in the same order.
  int64_t Get() const;
  void Set(int64_t value);
  int64_t& host() { return host_; }
  // The counter tensor for draws beside x: replicated on x's placement (on
  // x's device for a local x), made on the first call from the count so
  // far. Every later x must lie there too.
  const Tensor& TensorBeside(const Tensor& x);

 private:
  int64_t host_ = 0;
  Tensor tensor_;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Parameters of this module and its submodules, named "sub.name".
  std::vector<std::pair<std::string, Tensor*>> NamedParameters();
  std::vector<Tensor*> Parameters();
  // Parameters and buffers by name (the tensors themselves, shared).
  std::map<std::string, Tensor> StateDict();
  // The random-number counters of this module and its submodules (how many
  // draws each dropout has made), by name: what a checkpoint saves so a
  // resumed run draws the masks the uninterrupted run would have.
  std::vector<std::pair<std::string, RngCounter*>> NamedRngCounters();
  void ZeroGrad();

  void Train(bool training = true);
  void Eval() { Train(false); }
  bool is_training() const { return training_; }

 protected:
  // Registers a member tensor; it must outlive the module's use.
  Tensor& RegisterParameter(const std::string& name, Tensor& t);
  Tensor& RegisterBuffer(const std::string& name, Tensor& t);
  void RegisterModule(const std::string& name, Module& m);
  // The counter that keys this module's random draws.
  void RegisterRngCounter(const std::string& name, RngCounter& counter);

 private:
  void Collect(const std::string& prefix, bool buffers, std::vector<std::pair<std::string, Tensor*>>* out);
  void CollectRngCounters(const std::string& prefix, std::vector<std::pair<std::string, RngCounter*>>* out);

  bool training_ = true;
  std::vector<std::pair<std::string, Tensor*>> params_, buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::vector<std::pair<std::string, RngCounter*>> rng_counters_;
};

// A model whose forward is its training loss: what parallel::parallelize
// takes (a model written for one device, its batch given by name).
class LossModule : public Module {
 public:
  // The scalar loss of a batch of named inputs ("ids", "labels", ...).
  virtual Tensor Loss(const std::map<std::string, Tensor>& inputs) const = 0;
};

}  // namespace tessel::nn
