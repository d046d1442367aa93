// Output-layer shapes of common models, the one table the CLI, the C API and Python share.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace lfce::runtime {

struct ModelPreset {
  const char* name;
  int64_t hidden;
  int64_t vocab;
};

const std::vector<ModelPreset>& model_presets();
// Throws SpecError naming the model and listing the known ones.
const ModelPreset& model_preset(std::string_view name);

}  // namespace lfce::runtime
