// The kernel templates, one file each, and the registry that turns a KernelSpec into PTX.
#pragma once

#include <llvm/IR/Module.h>

#include <string>

#include "compiler/kernel_signature.h"
#include "compiler/kernel_spec.h"

namespace lfce {

// What a built kernel needs at launch: its CTA size and shared memory, and the names and types
// of its parameters (its KernelBuilder's signature), to which the runtime binds the arguments.
struct KernelShape {
  std::string entry;
  int threads = 0;
  int smem_bytes = 0;  // dynamic shared memory
  KernelSignature params;
};

// lse_combine's threads per CTA (one per token).
inline constexpr int kLseCombineThreads = 256;

KernelShape build_lse_forward(llvm::Module& module, const KernelSpec& spec);
KernelShape build_lse_combine(llvm::Module& module, const KernelSpec& spec);
KernelShape build_loss_reduce(llvm::Module& module, const KernelSpec& spec);
KernelShape build_dlogits_backward(llvm::Module& module, const KernelSpec& spec);
KernelShape build_grad_weight(llvm::Module& module, const KernelSpec& spec);
KernelShape build_grad_input(llvm::Module& module, const KernelSpec& spec);
KernelShape build_grad_bias(llvm::Module& module, const KernelSpec& spec);
// Eager mode's three-GEMM schedule; token_count is loss_reduce without the losses.
KernelShape build_token_count(llvm::Module& module, const KernelSpec& spec);
KernelShape build_eager_logits(llvm::Module& module, const KernelSpec& spec);
KernelShape build_eager_dz(llvm::Module& module, const KernelSpec& spec);
KernelShape build_grad_convert(llvm::Module& module, const KernelSpec& spec);
KernelShape build_grad_scale(llvm::Module& module, const KernelSpec& spec);

// Builds the kernel of `spec` into `module` with its kind's builder (the registry's table): the IR
// and its shape, nothing validated or emitted.
KernelShape build_kernel(llvm::Module& module, const KernelSpec& spec);

struct GeneratedKernel {
  KernelShape shape;
  std::string ptx;
  double compile_ms = 0;  // IR building + O3 + PTX emission
};

// Validates the spec, builds its kernel and emits PTX. Thread-safe. The spec is used as
// given: callers that want kernels shared across unread fields pass spec.normalised().
GeneratedKernel generate_kernel(const KernelSpec& spec);

// The dynamic shared memory the kernel of `spec` asks for, computed from kKernelKinds and the
// GEMM skeleton's geometry without building IR (the autotuner and the runtime prune tiles
// with it). generate_kernel() checks that the built kernel agrees.
int kernel_smem_bytes(const KernelSpec& spec);
// The CTA size the kernel of `spec` is built for, without building IR: a GEMM's tile's
// threads, another kind's fixed size (the registry's table). generate_kernel() checks that the
// built kernel agrees; the disk cache checks a cached entry's launch shape against both.
int kernel_threads(const KernelSpec& spec);
// A GEMM template's shared-memory bytes per BM row after the skeleton's (kKernelKinds' value,
// more with some loss options).
int kernel_smem_per_row(const KernelSpec& spec);

}  // namespace lfce
