#include "tools/train/model_registry.h"

#include "core/named_registry.h"

namespace tessel::train {
namespace {

NamedRegistry<ModelFactory>& Models() {
  static NamedRegistry<ModelFactory> registry(
      "model.arch", "train::RegisterModel or train::RegisterCausalLM",
      {{"gpt2", [](const TaskContext& c) { return MakeCausalLMTask(c, BuildCausalLM); }},
       {"llama", [](const TaskContext& c) { return MakeCausalLMTask(c, BuildCausalLM); }},
       {"t5", MakeT5Task},
       {"bert", MakeBertTask},
       {"vit", MakeViTTask}});
  return registry;
}

}  // namespace

void RegisterModel(const std::string& name, ModelFactory factory) {
  TESSEL_CHECK(factory != nullptr) << "RegisterModel('" << name << "'): no factory given";
  // "gpt" is gpt2's other name in configs.
  TESSEL_CHECK(name != "gpt") << "RegisterModel: a model.arch named 'gpt' is already registered (GPT-2's)";
  Models().Add(name, std::move(factory));
}

void RegisterCausalLM(const std::string& name, CausalLMFactory factory) {
  TESSEL_CHECK(factory != nullptr) << "RegisterCausalLM('" << name << "'): no factory given";
  RegisterModel(name, [factory = std::move(factory)](const TaskContext& context) {
    return MakeCausalLMTask(context, factory);
  });
}

std::vector<std::string> ModelNames() { return Models().Names(); }

std::unique_ptr<Task> MakeTask(const TaskContext& context) {
  const std::string& arch = context.config.model().arch();
  std::unique_ptr<Task> task = Models().Get(arch)(context);
  TESSEL_CHECK(task != nullptr) << "model.arch '" << arch << "': its factory made no task";
  return task;
}

}  // namespace tessel::train
