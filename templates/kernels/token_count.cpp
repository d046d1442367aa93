// token_count (eager mode's three-GEMM schedule): loss_reduce without the losses. It writes the
// count of non-ignored targets (and with class weights Σ w_y to valid_count[1]) before any dz is
// formed, since eager_dz divides by them, with loss_reduce's per-thread order and tree
// (token_sums.h), so loss_reduce later writes the same bits there.
#include "templates/kernels/token_sums.h"
#include "templates/templates.h"

namespace lfce {

KernelShape build_token_count(llvm::Module& module, const KernelSpec& spec) {
  std::vector<Param> params = {{"targets", ParamType::GlobalPtr},
                               {"n", ParamType::I64},
                               {"ignore_index", ParamType::I64},
                               {"valid_count", ParamType::GlobalPtr}};
  add_token_sum_params(spec, params);
  const std::string name(kind_name(spec.kind));
  KernelBuilder kb(module, name, params, kTokenSumThreads);
  sum_tokens(kb, spec, nullptr, nullptr);
  kb.finish();
  return {name, kTokenSumThreads, kernel_smem_bytes(spec), kb.signature()};
}

}  // namespace lfce
