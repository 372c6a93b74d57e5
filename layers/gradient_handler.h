// Gradient handlers: what happens to the gradients between backward and
// the optimizer (clipping by the global norm stays the optimizer's own
// step). Colossal-AI users know them as the place for their own gradient
// treatment; in tessel the data-parallel and tensor-parallel reductions are
// not handlers but layouts (a gradient is Partial until it is reduced), so
// each gradient reaches the handlers reduced, in the layout the optimizer
// reads (replicated over dp, or its ZeRO shard), as a global tensor the
// handler changes with fn:: ops. The same code then runs eagerly and in graph
// mode, where it is traced into the step once.
//
// Handlers are registered by name and listed in the config, applied in the
// order given:
//
//   train { gradient_handler { name: "clip_value" options { key: "max_value" value: "0.5" } } }
//
// Built in: "clip_value" clamps every gradient element to [-max_value,
// max_value] (PyTorch's clip_grad_value_). A program adds its own before
// the training starts (docs/extending.md):
//
//   optim::RegisterGradientHandler("scale", [](const optim::HandlerOptions& options) {
//     const double factor = optim::NumberOption(options, "factor", "scale");
//     return [factor](const optim::NamedParams& params) {
//       for (auto& [name, p] : params)
//         if (p->grad().defined()) p->set_grad(fn::mul_scalar(p->grad(), factor));
//     };
//   });
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "layers/optimizer.h"

namespace tessel::optim {

using HandlerOptions = std::map<std::string, std::string>;
// Changes the gradients of `params` (set_grad). Runs on every rank, in
// eager and graph mode, with autograd off.
using GradientHandler = std::function<void(const NamedParams& params)>;
// Checks a config's options (throwing, naming the option and what was
// expected, before any work starts) and makes the handler.
using GradientHandlerFactory = std::function<GradientHandler(const HandlerOptions& options)>;

// Adds a handler under `name` (letters, digits, '_', '-', '.'). Throws if
// the name is taken or malformed. Thread-safe.
void RegisterGradientHandler(const std::string& name, GradientHandlerFactory factory);
// The registered names, sorted.
std::vector<std::string> GradientHandlerNames();
// The handler `name` makes from `options`; an unregistered name throws
// listing the registered ones.
GradientHandler MakeGradientHandler(const std::string& name, const HandlerOptions& options);

// Reducers take over the reduction itself (Colossal-AI's handlers are
// that: compressed, hierarchical, bucketed otherwise). A reducer gets the
// gradients as backward left them — a data-parallel gradient Partial over
// the dp axis, one of a replicated weight used by split compute Partial
// over that axis — and the layout each must reach (`layouts[i]`, one per
// parameter: its own, or its ZeRO shard's), and leaves every gradient of a
// global parameter on its parameter's placement in exactly that layout,
// with fn:: ops and to_global, so it runs eagerly and traced alike.
// ApplyGradientHandlers checks the layouts it leaves and names the
// parameter of one that is not reduced; a reducer that moves the right
// layouts but not the right values (each rank's own part relabelled as
// the sum) cannot be seen that way and trains a different model.
//
//   train { gradient_reducer { name: "bf16_all_reduce" } }
//
// Built in: "bf16_all_reduce" sends each gradient as bf16 (half the bytes
// of f32) and casts the sum back: each rank's part is rounded to bf16 once
// and the sum once more (parts are added in f32, as NCCL does; bf16 keeps
// 8 significant bits), so an element is off by at most 2^-8 x (the sum of
// its parts' magnitudes + the sum's magnitude): 2^-7 of it, under 0.8%, when
// the parts agree in sign.
using GradientReducer = std::function<void(const NamedParams& params, const std::vector<NdSbp>& layouts)>;
using GradientReducerFactory = std::function<GradientReducer(const HandlerOptions& options)>;
void RegisterGradientReducer(const std::string& name, GradientReducerFactory factory);
std::vector<std::string> GradientReducerNames();
GradientReducer MakeGradientReducer(const std::string& name, const HandlerOptions& options);
// The gradients into grad_layouts[i] (the parameter's own layout when
// empty): by `reducer` when given (its result checked: a global
// parameter's gradient not on its placement in that layout throws naming
// the reducer, the parameter and both layouts), else by the layout's own
// reduction (ReducedGrad). With autograd off.
void ReduceGradients(const NamedParams& params, const std::vector<NdSbp>& grad_layouts = {},
                     const GradientReducer& reducer = nullptr, const std::string& reducer_name = "");

// Reduces each gradient into grad_layouts[i] (AdamW::GradientLayouts; the
// parameter's own layout when empty; ReduceGradients, with `reducer` when
// given), then runs `handlers` in order on `params`, with autograd off.
// Without handlers or a reducer it does nothing (clipping reduces).
void ApplyGradientHandlers(const std::vector<GradientHandler>& handlers, const NamedParams& params,
                           const std::vector<NdSbp>& grad_layouts = {},
                           const GradientReducer& reducer = nullptr, const std::string& reducer_name = "");

// Option `key` of handler `handler` as a number; a missing or malformed
// value throws naming both. For factories.
double NumberOption(const HandlerOptions& options, const std::string& key, const std::string& handler);

}  // namespace tessel::optim
