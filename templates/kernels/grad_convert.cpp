// grad_convert: dst[i] = src[i] rounded to the dtype, persistent threads striding over `count`
// elements, for the fp32 sums that eager mode's three-GEMM schedule accumulates grad_weight and
// grad_bias in when the tokens take several chunks (each chunk's grad_weight is added in fp32, in
// chunk order: deterministic).

#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_grad_convert(llvm::Module& module, const KernelSpec& spec) {
  constexpr int kThreads = 256;
  KernelBuilder kb(module, "grad_convert",
                   {{"src", ParamType::GlobalPtr}, {"dst", ParamType::GlobalPtr}, {"count", ParamType::I64}}, kThreads);
  llvm::Type* elem = elem_type(kb, spec.dtype);
  auto [first, stride] = grid_stride(kb, kThreads);
  kb.for_range(first, kb.arg("count"), stride, [&](Value* i) {
    Value* value = kb.load(kb.f32(), kb.gep(kb.arg("src"), kb.f32(), i));
    kb.store(kb.from_f32(value, elem), kb.gep(kb.arg("dst"), elem, i));
  });
  kb.finish();
  return {"grad_convert", kThreads, 0, kb.signature()};
}

}  // namespace lfce
