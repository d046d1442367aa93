// KernelSpec: everything a generated kernel is specialised on, as one immutable value.
// Its canonical text is the specialisation key and (with toolchain versions) the cache key.
// The number of tokens N is never part of it: N is a run-time argument of every kernel.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "compiler/arch.h"

namespace lfce {

enum class KernelKind {
  LseForward,       // logits tile GEMM + per-row (max, sum-exp) and target-logit epilogue
  LseCombine,       // per-token LSE and loss from the per-split partials
  LossReduce,       // mean / sum of the per-token losses and the valid-token count
  DlogitsBackward,  // recomputed logits -> dlogits for one vocabulary chunk
  GradWeight,       // grad_weight[chunk] = dlogitsᵀ · x
  GradInput,        // grad_input += dlogits · W[chunk]
  GradBias,         // grad_bias[chunk] = Σ_tokens dlogits
};
enum class DType { BF16, FP16, FP32 };
enum class IndexType { I64, I32 };
enum class Reduction { Mean, Sum, None };
enum class Mode { Recompute, Eager };

std::string_view kind_name(KernelKind kind);
std::string_view dtype_name(DType dtype);
std::string_view reduction_name(Reduction reduction);
std::string_view mode_name(Mode mode);
int dtype_bytes(DType dtype);

// CTA tile of the GEMM skeleton: BM x BN outputs, BK deep, warps_m x warps_n warps, `stages`
// shared-memory buffers in flight.
struct TileConfig {
  int bm = 128, bn = 128, bk = 64;
  int warps_m = 2, warps_n = 4;
  int stages = 3;
  int threads() const { return warps_m * warps_n * 32; }
  auto tie() const { return std::tie(bm, bn, bk, warps_m, warps_n, stages); }
  bool operator==(const TileConfig& o) const { return tie() == o.tie(); }
  bool operator<(const TileConfig& o) const { return tie() < o.tie(); }
};

class KernelSpec {
 public:
  KernelKind kind = KernelKind::LseForward;
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t chunk = 0;  // vocabulary chunk width of the backward kernels, 0 where unused
  Mode mode = Mode::Recompute;
  DType dtype = DType::BF16;
  IndexType targets = IndexType::I64;
  Reduction reduction = Reduction::Mean;
  bool bias = false;
  Arch arch = Arch::SM90A;
  TileConfig tile;

  // Canonical text, e.g.
  // "lse_forward;V=128256;H=4096;chunk=0;mode=recompute;dtype=bf16;targets=i64;reduction=mean;
  //  bias=0;arch=sm_90a;tile=128x128x64/2x4/s3"
  std::string text() const;
  static KernelSpec parse(std::string_view text);  // throws SpecError naming the bad field
  uint64_t hash() const;                           // FNV-1a over text(): stable across runs
  // Throws SpecError if the spec cannot be generated (sizes, tile shape, arch limits).
  void validate() const;

  auto tie() const {
    return std::tie(kind, vocab, hidden, chunk, mode, dtype, targets, reduction, bias, arch, tile);
  }
  bool operator==(const KernelSpec& o) const { return tie() == o.tie(); }
  bool operator!=(const KernelSpec& o) const { return !(*this == o); }
  bool operator<(const KernelSpec& o) const { return tie() < o.tie(); }
};

struct KernelSpecHash {
  size_t operator()(const KernelSpec& spec) const { return static_cast<size_t>(spec.hash()); }
};

}  // namespace lfce
