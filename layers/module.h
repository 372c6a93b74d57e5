// nn::Module: named parameters, buffers and submodules, train/eval.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tessel::nn {

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
  void ZeroGrad();

  void Train(bool training = true);
  void Eval() { Train(false); }
  bool is_training() const { return training_; }

 protected:
  // Registers a member tensor; it must outlive the module's use.
  Tensor& RegisterParameter(const std::string& name, Tensor& t);
  Tensor& RegisterBuffer(const std::string& name, Tensor& t);
  void RegisterModule(const std::string& name, Module& m);

 private:
  void Collect(const std::string& prefix, bool buffers, std::vector<std::pair<std::string, Tensor*>>* out);

  bool training_ = true;
  std::vector<std::pair<std::string, Tensor*>> params_, buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
};

}  // namespace tessel::nn
