// One row per kernel kind: what the kernel is, which spec fields its generated code depends
// on, and what the GEMM skeleton needs of it to size shared memory without building IR.
// Every other layer asks this table instead of listing kinds itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

namespace lfce {

// Recompute mode's kinds in launch order, then those only eager mode's three-GEMM schedule runs
// (lfce_forward_backward). Add a row to kKernelKinds for each kind (a static_assert below checks).
enum class KernelKind {
  LseForward,       // logits tile GEMM + per-row (max, sum-exp) and target-logit epilogue
  LseCombine,       // per-token LSE and loss from the per-split partials
  LossReduce,       // mean / sum of the per-token losses and the valid-token count
  DlogitsBackward,  // recomputed logits -> dlogits for one vocabulary chunk
  GradWeight,       // grad_weight[chunk] = dlogitsᵀ · x
  GradInput,        // grad_input += dlogits · W[chunk]
  GradBias,         // grad_bias[chunk] = Σ_tokens dlogits
  TokenCount,       // eager: the valid-token count (and Σ w_y) before any dz is formed
  EagerLogits,      // eager: logits tile GEMM -> exp(u - tile row max) stored as dzᵀ + per-tile row partials
  EagerDz,          // eager: those exponentials -> dz in place, with the target residual
  GradConvert,      // eager: fp32 gradient sums (several token chunks) -> the dtype
  GradScale,        // eager: the held gradients times the upstream gradient (the autograd backward)
};

// How a GEMM operand is stored: K contiguous, or M (N) contiguous.
enum class Layout { KMajor, MNMajor };

// KernelSpec fields a kind's generated code may depend on (kind and arch always do).
enum SpecField : uint32_t {
  kFieldVocab = 1u << 0,
  kFieldHidden = 1u << 1,
  kFieldChunk = 1u << 2,
  kFieldMode = 1u << 3,
  kFieldDType = 1u << 4,
  kFieldTargets = 1u << 5,
  kFieldReduction = 1u << 6,
  kFieldBias = 1u << 7,
  kFieldTile = 1u << 8,
  kFieldSoftcap = 1u << 9,
  kFieldTemperature = 1u << 10,
  kFieldZLoss = 1u << 11,
  kFieldLabelSmoothing = 1u << 12,
  kFieldClassWeight = 1u << 13,
  kFieldAccumulate = 1u << 14,
  kFieldTokenScaling = 1u << 15,
  kFieldEntropy = 1u << 16,
  kFieldArgmax = 1u << 17,
  kFieldLogprob = 1u << 18,
  kFieldLseGrad = 1u << 19,
  kFieldShift = 1u << 20,  // read wherever the targets are (load_target): KernelSpec::fields_read()
  kFieldEagerOperand = 1u << 21,
  kFieldEagerFixup = 1u << 22,
};
inline constexpr uint32_t kAllSpecFields = (1u << 23) - 1;

struct KernelKindInfo {
  KernelKind kind;
  std::string_view name;
  bool gemm;            // written against the GEMM skeleton: has a tile (and so a tuning)
  bool backward;        // run by lfce_backward (else by lfce_forward)
  bool chunked;         // run once per vocabulary chunk
  bool bias_only;       // run only for problems with a bias
  Layout a, b;          // GEMM operand layouts (the GemmSkeleton constructor in templates/)
  int smem_bytes;       // not a GEMM: the template's fixed dynamic shared memory
  bool thread_per_row;  // GEMM: sets up per-row statistics one thread per row, so BM <= threads
  uint32_t reads;       // SpecField bits the code depends on, whatever the dtype
  // Divides out dz_scale (templates/template_util.h): for fp16 the code also depends on the
  // reduction, and on the mode unless the reduction is none. See fields_read().
  bool unscales_dz;
  // Adds each token's target term back unrounded (grad_input; docs/design.md, Numerics): for 16-bit dtypes
  // the code also reads the targets.
  bool adds_target_term = false;
  // Run only by eager mode's three-GEMM schedule (lfce_forward_backward), never tuned on its own
  // (eager_logits takes dlogits_backward's tile: the same GEMM over K = H).
  bool eager = false;
};

// Shared memory: a GEMM kind's per-row slots after the skeleton's are laid out in one place,
// templates/epilogue/row_slots.h; loss_reduce's tree holds two floats for each of its 1024 threads.
// Fields: the template's own reads of spec.<field>, and those of the helpers it calls
// (load_target: targets and shift; load_bias: bias, dtype; elem_type: dtype; GemmSkeleton: tile, dtype).
// No kind reads the chunk: a chunk's offset and length are run-time arguments (v_begin, v_len).
inline constexpr uint32_t kGemmFields = kFieldHidden | kFieldDType | kFieldTile;
// The options that map each logit before the softmax: read wherever logits are.
inline constexpr uint32_t kLogitMapFields = kFieldSoftcap | kFieldTemperature;
// The options of the cross-entropy term (PyTorch's label_smoothing and weight). lse_forward
// reads the class weights only with label smoothing (its weighted logit sum), loss_reduce the
// z-loss only with class weights (its own denominator): KernelSpec::fields_read().
inline constexpr uint32_t kTargetTermFields = kFieldLabelSmoothing | kFieldClassWeight;
// The extra per-token outputs (lfce_problem.outputs) and the backward through the lse rows:
// dlogits_backward reads the entropy and logprob flags only with lse_grad (KernelSpec::fields_read).
inline constexpr uint32_t kOutputFields = kFieldEntropy | kFieldLogprob;
inline constexpr KernelKindInfo kKernelKinds[] = {
    // kind, name, gemm, backward, chunked, bias_only, a, b, smem_bytes, thread_per_row,
    // reads, unscales_dz[, adds_target_term]
    {KernelKind::LseForward, "lse_forward", true, false, false, false, Layout::KMajor, Layout::KMajor, 0, true,
     kGemmFields | kFieldVocab | kFieldTargets | kFieldBias | kLogitMapFields | kTargetTermFields | kFieldEntropy |
         kFieldArgmax,
     false},
    {KernelKind::LseCombine, "lse_combine", false, false, false, false, Layout::KMajor, Layout::KMajor, 0, false,
     kFieldVocab | kFieldTargets | kFieldZLoss | kTargetTermFields | kFieldTokenScaling | kOutputFields | kFieldArgmax,
     false},
    {KernelKind::LossReduce, "loss_reduce", false, false, false, false, Layout::KMajor, Layout::KMajor, 8192, false,
     kFieldTargets | kFieldReduction | kFieldClassWeight | kFieldZLoss | kFieldTokenScaling, false},
    {KernelKind::DlogitsBackward, "dlogits_backward", true, true, true, false, Layout::KMajor, Layout::KMajor, 0, true,
     kGemmFields | kFieldMode | kFieldTargets | kFieldReduction | kFieldBias | kLogitMapFields | kFieldZLoss |
         kTargetTermFields | kFieldTokenScaling | kOutputFields | kFieldLseGrad,
     false},
    {KernelKind::GradWeight, "grad_weight", true, true, true, false, Layout::KMajor, Layout::MNMajor, 0, false,
     kGemmFields | kFieldAccumulate | kFieldEagerOperand | kFieldEagerFixup, true},
    {KernelKind::GradInput, "grad_input", true, true, true, false, Layout::MNMajor, Layout::MNMajor, 0, false,
     kGemmFields | kFieldEagerOperand, true, true},
    {KernelKind::GradBias, "grad_bias", false, true, true, true, Layout::KMajor, Layout::KMajor, 0, false,
     kFieldDType | kFieldAccumulate, true},
    // Eager mode's three-GEMM schedule (templates/kernels/eager_logits.cpp, eager_dz.cpp, loss_reduce.cpp,
    // grad_convert.cpp). token_count reads the class weights' bound (V) with class weights, as loss_reduce.
    {KernelKind::TokenCount, "token_count", false, false, false, false, Layout::KMajor, Layout::KMajor, 8192, false,
     kFieldTargets | kFieldClassWeight, false, false, true},
    {KernelKind::EagerLogits, "eager_logits", true, false, false, false, Layout::KMajor, Layout::KMajor, 0, true,
     kGemmFields | kFieldVocab | kFieldTargets | kFieldBias | kFieldTemperature, false, false, true},
    {KernelKind::EagerDz, "eager_dz", false, false, false, false, Layout::KMajor, Layout::KMajor, 0, false,
     kFieldDType | kFieldTargets | kFieldReduction | kFieldTemperature | kFieldZLoss | kFieldClassWeight |
         kFieldTokenScaling | kFieldEagerOperand,
     false, false, true},
    {KernelKind::GradConvert, "grad_convert", false, false, false, false, Layout::KMajor, Layout::KMajor, 0, false,
     kFieldDType, false, false, true},
    {KernelKind::GradScale, "grad_scale", false, true, false, false, Layout::KMajor, Layout::KMajor, 0, false,
     kFieldDType, false, false, true},
};

constexpr bool kinds_in_enum_order() {
  for (size_t i = 0; i < std::size(kKernelKinds); ++i)
    if (static_cast<size_t>(kKernelKinds[i].kind) != i) return false;
  return true;
}
static_assert(kinds_in_enum_order(), "kKernelKinds: one row per KernelKind, in enum order");

// The row of `kind`; throws InternalError for a value outside the enum.
const KernelKindInfo& kind_info(KernelKind kind);
std::string_view kind_name(KernelKind kind);
// Throws SpecError naming `name` and the accepted names.
KernelKind parse_kind(std::string_view name);

}  // namespace lfce
