#include <llvm/IR/LLVMContext.h>

#include <chrono>
#include <iterator>

#include "compiler/errors.h"
#include "compiler/nvptx_backend.h"
#include "templates/epilogue/row_slots.h"
#include "templates/gemm/gemm_skeleton.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {
namespace {

using Builder = KernelShape (*)(llvm::Module&, const KernelSpec&);

struct Template {
  KernelKind kind;
  Builder build;
  int threads;  // not a GEMM: the CTA size the builder uses (a GEMM's is its tile's: 0 here)
};

// One builder per row of kKernelKinds, in the same order.
// clang-format off
constexpr Template kTemplates[] = {
    {KernelKind::LseForward, build_lse_forward, 0},
    {KernelKind::LseCombine, build_lse_combine, kLseCombineThreads},
    {KernelKind::LossReduce, build_loss_reduce, 1024},
    {KernelKind::DlogitsBackward, build_dlogits_backward, 0},
    {KernelKind::GradWeight, build_grad_weight, 0},
    {KernelKind::GradInput, build_grad_input, 0},
    {KernelKind::GradBias, build_grad_bias, 256},
    {KernelKind::TokenCount, build_token_count, 1024},
    {KernelKind::EagerLogits, build_eager_logits, 0},
    {KernelKind::EagerDz, build_eager_dz, 256},
    {KernelKind::GradConvert, build_grad_convert, 256},
    {KernelKind::GradScale, build_grad_scale, 256},
};
// clang-format on

constexpr bool every_kind_has_a_template() {
  if (std::size(kTemplates) != std::size(kKernelKinds)) return false;
  for (size_t i = 0; i < std::size(kTemplates); ++i)
    // (A builder's address is not a constant under -fsanitize: KernelKindTable's test checks
    // that each one builds its kind.)
    if (kTemplates[i].kind != kKernelKinds[i].kind) return false;
  return true;
}
static_assert(every_kind_has_a_template(), "kTemplates: one builder per row of kKernelKinds, in its order");

}  // namespace

int kernel_smem_per_row(const KernelSpec& spec) { return row_slots(spec).bytes; }

int kernel_smem_bytes(const KernelSpec& spec) {
  const KernelKindInfo& info = kind_info(spec.kind);
  // loss_reduce's tree, with class weights: four sums instead of two; lse_combine's tree of Σ w_v
  // (class-weighted smoothing).
  if ((spec.kind == KernelKind::LossReduce || spec.kind == KernelKind::TokenCount) && spec.class_weight)
    return 2 * info.smem_bytes;
  if (spec.kind == KernelKind::LseCombine && spec.class_weight && spec.label_smoothing != 0.f)
    return kLseCombineThreads * 4;
  if (!info.gemm) return info.smem_bytes;
  return gemm_smem_bytes(spec.tile, spec.dtype, info.a, info.b, kernel_smem_per_row(spec) * spec.tile.bm);
}

KernelShape build_kernel(llvm::Module& module, const KernelSpec& spec) {
  return kTemplates[static_cast<size_t>(kind_info(spec.kind).kind)].build(module, spec);
}

int kernel_threads(const KernelSpec& spec) {
  if (kind_info(spec.kind).gemm) return spec.tile.threads();
  return kTemplates[static_cast<size_t>(spec.kind)].threads;
}

GeneratedKernel generate_kernel(const KernelSpec& spec) {
  spec.validate();
  auto start = std::chrono::steady_clock::now();
  llvm::LLVMContext ctx;
  auto module = new_module(ctx, spec.text(), spec.arch);
  GeneratedKernel out;
  out.shape = build_kernel(*module, spec);
  if (out.shape.smem_bytes != kernel_smem_bytes(spec))
    throw InternalError(std::string(kind_name(spec.kind)) + " asks for " + std::to_string(out.shape.smem_bytes) +
                        " bytes of shared memory, kernel_smem_bytes() says " +
                        std::to_string(kernel_smem_bytes(spec)) + "; update kKernelKinds");
  if (out.shape.threads != kernel_threads(spec))
    throw InternalError(std::string(kind_name(spec.kind)) + " is built for " + std::to_string(out.shape.threads) +
                        " threads, kernel_threads() says " + std::to_string(kernel_threads(spec)) +
                        "; update kTemplates");
  // The signature returned is the one the kernel was built with: the runtime binds by it.
  const llvm::Function* fn = module->getFunction(out.shape.entry);
  bool same = fn && fn->arg_size() == out.shape.params.size();
  for (size_t i = 0; same && i < out.shape.params.size(); ++i)
    same = fn->getArg(static_cast<unsigned>(i))->getName() == out.shape.params[i].name;
  if (!same)
    throw InternalError(out.shape.entry + ": the parameters its builder returns are not the kernel's");
  const ArchInfo& arch = arch_info(spec.arch);
  if (out.shape.smem_bytes > arch.smem_per_block_optin)
    throw SpecError("tile needs " + std::to_string(out.shape.smem_bytes) + " bytes of shared memory, over the " +
                    std::to_string(arch.smem_per_block_optin) + " an " + arch.name + " CTA can have (" +
                    spec.text() + ")");
  out.ptx = emit_ptx(*module, spec.arch);
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace lfce
