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

void ApplyGradientHandlers(const std::vector<GradientHandler>& handlers, const NamedParams& params,
                           const std::vector<NdSbp>& grad_layouts) {
  if (handlers.empty()) return;
  NoGradGuard no_grad;
  TESSEL_CHECK(grad_layouts.empty() || grad_layouts.size() == params.size())
      << "ApplyGradientHandlers: " << grad_layouts.size() << " gradient layouts for " << params.size()
      << " parameters; expected one each (AdamW::GradientLayouts) or none";
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].second->is_global())
      ReducedGrad(params[i].second, grad_layouts.empty() ? nullptr : &grad_layouts[i]);
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
