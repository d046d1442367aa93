// Target GPUs: one table from arch to what codegen and the runtime need to know.
#pragma once

#include <string>
#include <string_view>

namespace lfce {

enum class Arch { SM80, SM90A };

struct ArchInfo {
  Arch arch;
  const char* name;          // as users and ptxas write it
  const char* llvm_cpu;      // NVPTX -mcpu
  const char* llvm_features; // PTX ISA version LLVM should emit
  int smem_per_block_optin;  // bytes of shared memory one CTA may opt into
  int regs_per_thread_max;
  int threads_per_block_max;
};

const ArchInfo& arch_info(Arch arch);
// Parses "sm_80" / "sm_90a"; throws SpecError naming the value and the accepted ones.
Arch parse_arch(std::string_view name);
std::string_view arch_name(Arch arch);
// The arch whose kernels run on a device of this compute capability (Ampere and newer).
Arch arch_for_compute_capability(int major, int minor);

}  // namespace lfce
