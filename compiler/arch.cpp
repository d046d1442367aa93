#include "compiler/arch.h"

#include "compiler/errors.h"

namespace lfce {
namespace {

// PTX 8.5 is the newest ISA LLVM 19 emits; CUDA 12.5+ drivers (ours: 13.0) JIT it.
constexpr ArchInfo kArchs[] = {
    {Arch::SM80, "sm_80", "sm_80", "+ptx85", 163 * 1024, 255, 1024},
    {Arch::SM90A, "sm_90a", "sm_90a", "+ptx85", 227 * 1024, 255, 1024},
};

}  // namespace

const ArchInfo& arch_info(Arch arch) {
  for (const ArchInfo& info : kArchs)
    if (info.arch == arch) return info;
  throw InternalError("arch_info: unknown arch");
}

Arch parse_arch(std::string_view name) {
  for (const ArchInfo& info : kArchs)
    if (name == info.name) return info.arch;
  throw SpecError("arch '" + std::string(name) + "' is not supported; expected sm_80 or sm_90a");
}

std::string_view arch_name(Arch arch) { return arch_info(arch).name; }

Arch arch_for_compute_capability(int major, int minor) {
  if (major == 9 && minor == 0) return Arch::SM90A;
  if (major >= 8) return Arch::SM80;  // the portable mma.sync path runs on every later GPU
  throw SpecError("compute capability " + std::to_string(major) + "." + std::to_string(minor) +
                  " is not supported; lfce needs an Ampere (8.0) or newer GPU");
}

}  // namespace lfce
