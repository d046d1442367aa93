// The NVPTX backend driver: module setup for an arch, then verify -> O3 -> verify -> PTX.
#pragma once

#include <llvm/IR/Module.h>

#include <memory>
#include <string>

#include "compiler/arch.h"

namespace lfce {

// An empty module with the NVPTX triple and data layout of `arch`.
std::unique_ptr<llvm::Module> new_module(llvm::LLVMContext& ctx, const std::string& name, Arch arch);

// Verifies the module, runs the O3 pipeline, verifies again and emits PTX text.
// Throws CompileError with LLVM's diagnostics if verification fails.
std::string emit_ptx(llvm::Module& module, Arch arch);

// Number of modules emitted in this process (a hook for cache tests).
int64_t emitted_module_count();

}  // namespace lfce
