// The parameters of a model a *_hf_dump program compares with Hugging
// Face's: either the model's own draws plus noise (every weight, bias and
// LayerNorm gain away from 0 and 1, so a mapping mistake cannot hide), or,
// with a checkpoint path, the checkpoint's weights (`model.<name>`, loaded
// under this launch's layout: an import from Hugging Face, or a training run).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "layers/module.h"
#include "layers/optimizer.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

namespace tessel::testing {

// What a dump program writes (rank 0), and the function that adds to it: a
// value gathered whole onto rank 0 and copied (parameters are updated in
// place later, and a gather may hand back their own storage). Every rank
// calls it, in the same order.
struct DumpOutputs {
  std::vector<std::pair<std::string, Tensor>> tensors;
  void operator()(const std::string& name, const Tensor& t) {
    std::vector<int> all_ranks(dist::WorldSize());
    for (int r = 0; r < dist::WorldSize(); ++r) all_ranks[r] = r;
    const Placement world(DeviceType::kCPU, all_ranks);
    Tensor full =
        t.is_global() ? GatherLogical(t.detach().to_global(world, NdSbp({Sbp::Broadcast()}))) : t.detach();
    if (dist::Rank() == 0) tensors.emplace_back(name, full.Clone());
  }
};

// The inputs the causal language models' dumps (GPT-2, Llama) compare with
// Hugging Face, kept (as input_ids, labels, position_ids, attention_mask):
// ids [batch, seq] of a fixed pattern below `vocab`; labels the next ids,
// -100 last; row r's positions shifted by r (kept below seq); row r's last
// r keys padding.
struct CausalLmInputs {
  Tensor ids, labels, positions, mask;
};
inline CausalLmInputs MakeCausalLmInputs(int64_t b, int64_t s, int64_t vocab, DumpOutputs& keep) {
  std::vector<int64_t> ids(b * s), labels(b * s), positions(b * s);
  std::vector<bool> attend(b * s);
  for (int64_t i = 0; i < b * s; ++i) ids[i] = (i * 7919 + 13) % vocab;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < s; ++t) {
      labels[r * s + t] = t + 1 < s ? ids[r * s + t + 1] : -100;
      positions[r * s + t] = r + t < s ? r + t : t;
      attend[r * s + t] = t < s - r;
    }
  CausalLmInputs in{Tensor::FromVector<int64_t>(ids, {b, s}), Tensor::FromVector<int64_t>(labels, {b, s}),
                    Tensor::FromVector<int64_t>(positions, {b, s}), Tensor::FromVector<bool>(attend, {b, s})};
  keep("input_ids", in.ids);
  keep("labels", in.labels);
  keep("position_ids", in.positions);
  keep("attention_mask", in.mask);
  return in;
}

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
  for (auto& [name, t] : params) {
    const bool trained = t->requires_grad();
    *t = fn::add(*t,
                 fn::mul_scalar(randn(t->shape(), t->placement(), t->nd_sbp(), seed_base + seed++), noise));
    t->set_requires_grad(trained);  // still a parameter (a new leaf)
  }
}

// What a *_hf_dump program writes about training, for a Hugging Face test to
// compare gradient by gradient and step by step: the gradient of every
// parameter after one backward of `loss` ("grad.<name>", absent where none
// arrived), then `steps` AdamW steps (lr `lr`, weight decay 0.1 on the
// parameters of two or more dimensions, as layers/optimizer.h decides) with
// the loss before each ("step_loss.<k>") and after the last
// ("step_loss.<steps>"), into `keep`.
// The parameters change: call it after everything else is kept.
inline void DumpTraining(nn::Module& model, const std::function<Tensor()>& loss, DumpOutputs& keep,
                         int steps = 5, double lr = 1e-3) {
  auto params = model.NamedParameters();
  for (auto& [name, t] : params) t->zero_grad();
  loss().backward();
  for (auto& [name, t] : params) {
    // Every rank takes part in the gather, so a gradient is looked at the
    // same way everywhere (ranks outside its placement hold metadata).
    if (t->grad().defined()) keep("grad." + name, t->grad());
  }
  for (auto& [name, t] : params) t->zero_grad();
  optim::AdamW adamw(params, {.lr = lr, .weight_decay = 0.1});
  for (int k = 0; k < steps; ++k) {
    const Tensor l = loss();
    keep("step_loss." + std::to_string(k), l);
    l.backward();
    adamw.Step();
  }
  NoGradGuard no_grad;
  keep("step_loss." + std::to_string(steps), loss());
}

}  // namespace tessel::testing
