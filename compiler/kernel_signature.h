// A kernel's signature as its launcher sees it: each parameter's name and type, in the order
// of the kernel's arguments. The template builder declares it (KernelBuilder's params), the
// disk cache keeps it with the kernel, and the runtime binds arguments to it by name
// (runtime/kernel_args.h). No LLVM here: the runtime reads it too.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lfce {

// TensorMap: a 128-byte CUtensorMap passed by value (byval, 64-byte aligned, grid_constant),
// read in place by TMA instructions through KernelBuilder::tensor_map().
enum class ParamType { GlobalPtr, I64, I32, F32, TensorMap };

struct KernelParam {
  std::string name;
  ParamType type;
  bool operator==(const KernelParam& o) const { return name == o.name && type == o.type; }
  bool operator!=(const KernelParam& o) const { return !(*this == o); }
};
using KernelSignature = std::vector<KernelParam>;

// "ptr", "i64", "i32", "f32", "tensor_map": the names the cache metadata and the argument
// pack's messages use.
inline const char* param_type_name(ParamType type) {
  switch (type) {
    case ParamType::GlobalPtr: return "ptr";
    case ParamType::I64: return "i64";
    case ParamType::I32: return "i32";
    case ParamType::F32: return "f32";
    case ParamType::TensorMap: return "tensor_map";
  }
  return "?";
}

inline std::optional<ParamType> parse_param_type(std::string_view name) {
  for (ParamType type : {ParamType::GlobalPtr, ParamType::I64, ParamType::I32, ParamType::F32, ParamType::TensorMap})
    if (name == param_type_name(type)) return type;
  return std::nullopt;
}

}  // namespace lfce
