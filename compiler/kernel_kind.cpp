#include "compiler/kernel_kind.h"

#include <string>

#include "compiler/errors.h"

namespace lfce {

const KernelKindInfo& kind_info(KernelKind kind) {
  const auto index = static_cast<size_t>(kind);
  if (index >= std::size(kKernelKinds))
    throw InternalError("kernel kind " + std::to_string(index) + " has no row in kKernelKinds");
  return kKernelKinds[index];
}

std::string_view kind_name(KernelKind kind) { return kind_info(kind).name; }

KernelKind parse_kind(std::string_view name) {
  std::string accepted;
  for (const KernelKindInfo& info : kKernelKinds) {
    if (info.name == name) return info.kind;
    accepted += (accepted.empty() ? "" : ", ") + std::string(info.name);
  }
  throw SpecError("KernelSpec field 'kind' has value '" + std::string(name) + "'; expected one of " + accepted);
}

}  // namespace lfce
