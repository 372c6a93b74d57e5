// The parameters of a model a *_hf_dump program compares with Hugging
// Face's: either the model's own draws plus noise (every weight, bias and
// LayerNorm gain away from 0 and 1, so a mapping mistake cannot hide), or,
// with a checkpoint path, the checkpoint's weights (`model.<name>`, loaded
// under this launch's layout: an import from Hugging Face, or a training run).
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "graph/autograd.h"
#include "layers/module.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

namespace tessel::testing {

inline void InitDumpParameters(nn::Module& model, uint64_t seed_base, double noise, const std::string& load,
                               const std::map<std::string, int64_t>& padded_rows = {}) {
  NoGradGuard no_grad;
  auto params = model.NamedParameters();
  if (!load.empty()) {
    const std::filesystem::path found = checkpoint::Find(load);
    TESSEL_CHECK(!found.empty()) << "--load " << load << " holds no checkpoint";
    checkpoint::NamedTensors named;
    for (auto& [name, t] : params) named.emplace_back("model." + name, t);
    checkpoint::LoadOptions options;
    for (const auto& [name, rows] : padded_rows) options.padded_rows["model." + name] = rows;
    checkpoint::Load(found, named, options);
    return;
  }
  uint64_t seed = 1;
  for (auto& [name, t] : params)
    *t = fn::add(*t,
                 fn::mul_scalar(randn(t->shape(), t->placement(), t->nd_sbp(), seed_base + seed++), noise));
}

}  // namespace tessel::testing
