#include "layers/gradient_handler.h"

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "core/named_registry.h"
#include "graph/autograd.h"
#include "ops/functional.h"

namespace tessel::optim {

namespace {

// Every element into [-max, max]: g - relu(g - max) + relu(-g - max), so an
// element inside the range is unchanged bit for bit.
GradientHandler ClipValue(const HandlerOptions& options) {
  const double max_value = NumberOption(options, "max_value", "clip_value");
  TESSEL_CHECK(max_value > 0) << "gradient handler 'clip_value': option max_value is " << max_value
                              << "; expected a positive number";
  for (const auto& [key, value] : options)
    TESSEL_CHECK(key == "max_value") << "gradient handler 'clip_value' has no option '" << key
                                     << "'; expected max_value";
  return [max_value](const NamedParams& params) {
    for (auto& [name, p] : params) {
      const Tensor g = p->grad();
      if (!g.defined()) continue;
      const Tensor above = fn::relu(fn::add_scalar(g, -max_value));
      const Tensor below = fn::relu(fn::add_scalar(fn::neg(g), -max_value));
      p->set_grad(fn::add(fn::sub(g, above), below));
    }
  };
}

// Each gradient that needs reducing is cast to bf16, brought into its
// layout (the all-reduce or reduce-scatter then moves bf16), and cast back.
GradientReducer Bf16AllReduce(const HandlerOptions& options) {
  for (const auto& [key, value] : options)
    TESSEL_CHECK(false) << "gradient reducer 'bf16_all_reduce' has no option '" << key << "'; it takes none";
  return [](const NamedParams& params, const std::vector<NdSbp>& layouts) {
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor* p = params[i].second;
      const Tensor g = p->grad();
      if (!g.defined() || !g.is_global() || !p->is_global()) continue;
      const NdSbp& want = layouts[i];
      if (g.placement() == p->placement() && g.nd_sbp() == want) continue;
      const Tensor narrow = g.dtype() == DType::kBFloat16 ? g : fn::cast(g, DType::kBFloat16);
      const Tensor sum = narrow.to_global(p->placement(), want);
      p->set_grad(sum.dtype() == g.dtype() ? sum : fn::cast(sum, g.dtype()));
    }
  };
}

NamedRegistry<GradientReducerFactory>& Reducers() {
  static NamedRegistry<GradientReducerFactory> registry("gradient reducer", "optim::RegisterGradientReducer",
                                                        {{"bf16_all_reduce", Bf16AllReduce}});
  return registry;
}

NamedRegistry<GradientHandlerFactory>& Handlers() {
  static NamedRegistry<GradientHandlerFactory> registry("gradient handler", "optim::RegisterGradientHandler",
                                                        {{"clip_value", ClipValue}});
  return registry;
}

}  // namespace

void RegisterGradientHandler(const std::string& name, GradientHandlerFactory factory) {
  TESSEL_CHECK(factory != nullptr) << "RegisterGradientHandler('" << name << "'): no factory given";
  Handlers().Add(name, std::move(factory));
}

std::vector<std::string> GradientHandlerNames() { return Handlers().Names(); }

GradientHandler MakeGradientHandler(const std::string& name, const HandlerOptions& options) {
  GradientHandler handler = Handlers().Get(name)(options);
  TESSEL_CHECK(handler != nullptr) << "gradient handler '" << name << "': its factory made no handler";
  return handler;
}

void RegisterGradientReducer(const std::string& name, GradientReducerFactory factory) {
  TESSEL_CHECK(factory != nullptr) << "RegisterGradientReducer('" << name << "'): no factory given";
  Reducers().Add(name, std::move(factory));
}

std::vector<std::string> GradientReducerNames() { return Reducers().Names(); }

GradientReducer MakeGradientReducer(const std::string& name, const HandlerOptions& options) {
  GradientReducer reducer = Reducers().Get(name)(options);
  TESSEL_CHECK(reducer != nullptr) << "gradient reducer '" << name << "': its factory made no reducer";
  return reducer;
}

void ReduceGradients(const NamedParams& params, const std::vector<NdSbp>& grad_layouts,
                     const GradientReducer& reducer, const std::string& reducer_name) {
  NoGradGuard no_grad;
  TESSEL_CHECK(grad_layouts.empty() || grad_layouts.size() == params.size())
      << "ReduceGradients: " << grad_layouts.size() << " gradient layouts for " << params.size()
      << " parameters; expected one each (AdamW::GradientLayouts) or none";
  // The layout each gradient must reach, one per parameter.
  std::vector<NdSbp> targets = grad_layouts;
  if (targets.empty())
    for (const auto& [name, p] : params) targets.push_back(p->nd_sbp());
  if (!reducer) {
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].second->is_global()) ReducedGrad(params[i].second, &targets[i]);
    return;
  }
  reducer(params, targets);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const Tensor g = p->grad();
    if (!g.defined() || !g.is_global() || !p->is_global()) continue;
    const NdSbp& want = targets[i];
    TESSEL_CHECK(g.placement() == p->placement() && g.nd_sbp() == want)
        << "gradient reducer '" << reducer_name << "' left the gradient of '" << name << "' as "
        << g.nd_sbp().ToString() << " on " << g.placement().ToString() << "; expected " << want.ToString()
        << " on " << p->placement().ToString() << " (a reducer brings every gradient into the layout the "
        << "optimizer reads)";
  }
}

void ApplyGradientHandlers(const std::vector<GradientHandler>& handlers, const NamedParams& params,
                           const std::vector<NdSbp>& grad_layouts, const GradientReducer& reducer,
                           const std::string& reducer_name) {
  if (handlers.empty() && !reducer) return;
  NoGradGuard no_grad;
  ReduceGradients(params, grad_layouts, reducer, reducer_name);
  for (const GradientHandler& handler : handlers) handler(params);
}

double NumberOption(const HandlerOptions& options, const std::string& key, const std::string& handler) {
  const auto it = options.find(key);
  TESSEL_CHECK(it != options.end()) << "gradient handler '" << handler << "' needs option '" << key
                                    << "' (options { key: \"" << key << "\" value: \"...\" })";
  double value = 0;
  const char* end = it->second.data() + it->second.size();
  const auto [ptr, ec] = std::from_chars(it->second.data(), end, value);
  TESSEL_CHECK(ec == std::errc() && ptr == end && std::isfinite(value))
      << "gradient handler '" << handler << "': option " << key << " is '" << it->second
      << "'; expected a number";
  return value;
}

}  // namespace tessel::optim
