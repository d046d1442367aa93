#include <llvm/IR/LLVMContext.h>

#include <chrono>

#include "compiler/errors.h"
#include "compiler/nvptx_backend.h"
#include "templates/templates.h"

namespace lfce {
namespace {

using Builder = KernelShape (*)(llvm::Module&, const KernelSpec&);

struct Template {
  KernelKind kind;
  Builder build;
};

constexpr Template kTemplates[] = {
    {KernelKind::LseForward, build_lse_forward},   {KernelKind::LseCombine, build_lse_combine},
    {KernelKind::LossReduce, build_loss_reduce},   {KernelKind::DlogitsBackward, build_dlogits_backward},
    {KernelKind::GradWeight, build_grad_weight},   {KernelKind::GradInput, build_grad_input},
    {KernelKind::GradBias, build_grad_bias},
};

}  // namespace

GeneratedKernel generate_kernel(const KernelSpec& spec) {
  spec.validate();
  auto start = std::chrono::steady_clock::now();
  for (const Template& t : kTemplates) {
    if (t.kind != spec.kind) continue;
    llvm::LLVMContext ctx;
    auto module = new_module(ctx, spec.text(), spec.arch);
    GeneratedKernel out;
    out.shape = t.build(*module, spec);
    const ArchInfo& arch = arch_info(spec.arch);
    if (out.shape.smem_bytes > arch.smem_per_block_optin)
      throw SpecError("tile needs " + std::to_string(out.shape.smem_bytes) + " bytes of shared memory, over the " +
                      std::to_string(arch.smem_per_block_optin) + " an " + arch.name + " CTA can have (" +
                      spec.text() + ")");
    out.ptx = emit_ptx(*module, spec.arch);
    out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return out;
  }
  throw InternalError("no template for kernel kind " + std::string(kind_name(spec.kind)));
}

}  // namespace lfce
