#include "runtime/presets.h"

#include <string>

#include "compiler/errors.h"

namespace lfce::runtime {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"llama2-7b", 4096, 32000},    {"llama3-8b", 4096, 128256},   {"llama3-70b", 8192, 128256},
      {"mistral-7b", 4096, 32768},   {"qwen2.5-7b", 3584, 152064},  {"qwen2.5-14b", 5120, 152064},
      {"qwen2.5-72b", 8192, 152064}, {"gemma2-2b", 2304, 256000},   {"gemma2-9b", 3584, 256000},
      {"deepseek-v3", 7168, 129280},
  };
  return presets;
}

const ModelPreset& model_preset(std::string_view name) {
  std::string known;
  for (const ModelPreset& p : model_presets()) {
    if (name == p.name) return p;
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  throw SpecError("unknown model '" + std::string(name) + "'; known models: " + known);
}

}  // namespace lfce::runtime
