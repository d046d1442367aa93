// KernelSpec: everything a generated kernel is specialised on, as one immutable value.
// Its canonical text is the specialisation key and (with toolchain versions) the cache key.
// The number of tokens N is never part of it: N is a run-time argument of every kernel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "compiler/arch.h"
#include "compiler/kernel_kind.h"

namespace lfce {

enum class DType { BF16, FP16, FP32 };
enum class IndexType { I64, I32 };
enum class Reduction { Mean, Sum, None };
enum class Mode { Recompute, Eager };

std::string_view dtype_name(DType dtype);
std::string_view reduction_name(Reduction reduction);
std::string_view mode_name(Mode mode);
int dtype_bytes(DType dtype);
// The widest piece, in bytes, that every row of a row-major [*, H] matrix of `dtype` (hidden,
// weight and their gradients) can be copied in from a 16-byte aligned base: the largest of 16, 8
// and 4 that divides the row's H·elem bytes, else the element size. 16 lets the GEMMs copy with
// 16-byte cp.async and, on sm_90a, TMA (whose global row strides are multiples of 16 bytes);
// narrower rows (H not a multiple of 8 in 16-bit, of 4 in fp32) are copied in these pieces by the
// mma.sync / SIMT mainloops (templates/gemm/gemm_skeleton.cpp) and never take the wgmma pipeline.
int hidden_row_align(int64_t hidden, DType dtype);

// The largest sizes a spec (and so a problem) may carry; validate() and the C API's problem check
// reject larger ones naming the value.
// V: vocabulary indices (targets, chunk offsets) stay within 32 bits.
constexpr int64_t kMaxVocab = (int64_t{1} << 31) - 1;
// H: grad_weight and grad_input tile H along grid y, where CUDA allows 65535 CTAs; every valid
// tile has BN >= 32, so 2^20 keeps ceil(H / BN) <= 32768 (the largest models have H = 16384).
constexpr int64_t kMaxHidden = int64_t{1} << 20;
// chunk: dlogits_backward tiles its vocabulary chunk along grid y, with the same bound.
constexpr int64_t kMaxChunk = int64_t{1} << 20;

// CTA tile of the GEMM skeleton: BM x BN outputs, BK deep, `stages` shared-memory buffers in
// flight, and the mainloop that computes it:
//   consumers == 0: cp.async + mma.sync (16-bit) or SIMT FMA (fp32) over warps_m x warps_n warps
//                   (text "BMxBNxBK/WMxWN/sS");
//   consumers >= 1: sm_90a only, TMA + wgmma, warp-specialised: one producer warpgroup issues
//                   the TMA loads, `consumers` warpgroups run wgmma, each on BM/consumers rows
//                   (text "BMxBNxBK/wgC/sS"; warps_m = warps_n = 1).
struct TileConfig {
  // Field ranges checked by check_range(); products of fields in range fit in int.
  static constexpr int kMaxDim = 1024;   // BM, BN, BK
  static constexpr int kMaxWarps = 32;   // warps_m, warps_n (a CTA has at most 32 warps)
  static constexpr int kMaxStages = 8;
  static constexpr int kMaxConsumers = 2;
  static constexpr int kMaxCluster = 2;
  // fp32 accumulators a wgmma consumer thread may hold (m64nN: N/2 per m64 block). cuBLAS's
  // split 192 x 192 tile holds 144; with lfce's dlogits epilogue ptxas then ignored setmaxnreg
  // (C7508) and spilled 1.3 KB, so 128 (measured when the driver compiled every kernel as
  // relocatable code, ignoring setmaxnreg: docs/design.md, compiled whole).
  static constexpr int kMaxAccumulators = 128;

  int bm = 128, bn = 128, bk = 64;
  int warps_m = 2, warps_n = 4;
  int stages = 3;
  int consumers = 0;
  // CTAs per thread-block cluster (wgmma tiles of the persistent backward GEMMs): the pair
  // computes two tiles adjacent along M, and each CTA loads half of their shared B tile into
  // both (TMA multicast), halving B's traffic from L2.
  int cluster = 1;
  // With a cluster: its CTAs compute tiles adjacent along N instead, sharing their A tile, of
  // which each loads 1/cluster into every CTA ("/c2n"; grad_weight and grad_input, whose A is
  // the [tokens, V] dz that the GEMM streams: cuBLAS pairs its CTAs this way for both).
  bool cluster_n = false;
  // Ping-pong (wgmma tiles with two consumers, BM = 64 or 128): each consumer warpgroup computes
  // whole BM x BN tiles of its own, alternate tiles of the CTA's schedule, so one's epilogue runs
  // while the other's wgmma keep the tensor cores busy.
  bool pingpong = false;
  // Split along N (wgmma tiles with two consumers): each consumer warpgroup computes all BM rows
  // of its half of the columns (BM x BN/2, BM / 64 m64 blocks), so both read the whole A tile
  // and their own half of B (cuBLAS picks 192 x 192 split tiles for these shapes on the H200).
  bool split_n = false;
  bool wgmma() const { return consumers > 0; }
  // wgmma tiles: the rows one consumer warpgroup computes (all BM with ping-pong, else its
  // BM / consumers share), in m64 blocks, and the fp32 accumulators each of its threads holds.
  int consumer_rows() const { return pingpong || split_n ? bm : bm / std::max(consumers, 1); }
  int consumer_cols() const { return split_n ? bn / std::max(consumers, 1) : bn; }
  int m_blocks() const { return consumer_rows() / 64; }
  int accumulators() const { return m_blocks() * consumer_cols() / 2; }
  // CTAs the kernel is built to share an SM with (ptxas budgets registers for it): two for
  // one-consumer wgmma tiles, so that one CTA's epilogue overlaps the other's mainloop.
  int ctas_per_sm() const { return wgmma() && consumers == 1 ? 2 : 1; }
  int threads() const { return wgmma() ? 128 * (consumers + 1) : warps_m * warps_n * 32; }
  // "128x128x64/2x4/s3", "128x256x64/wg2/s4", "128x256x64/wg2/s4/c2", "128x192x64/wg2/s4/c2n",
  // "64x256x64/wg2/s5/c2/pp" or "192x192x64/wg2/s4/sn"
  std::string text() const;
  static TileConfig parse(std::string_view text);  // throws SpecError naming the text
  // Throws SpecError naming the first field outside its range. A tile may come from a file:
  // call this before any arithmetic on its fields.
  void check_range() const;
  auto tie() const { return std::tie(bm, bn, bk, warps_m, warps_n, stages, consumers, cluster, cluster_n, pingpong, split_n); }
  bool operator==(const TileConfig& o) const { return tie() == o.tie(); }
  bool operator<(const TileConfig& o) const { return tie() < o.tie(); }
};

// The shortest text that reads back as the same float ("30", "0.5", "nan").
std::string float_text(float value);

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
  static constexpr float kMaxSoftcap = 1e6f;
  static constexpr float kMinTemperature = 1e-6f, kMaxTemperature = 1e6f;
  static constexpr float kMaxZLossScale = 1e6f;
  // The options, each declared by its line in compiler/spec_options.def (which says what it means).
#define LFCE_SPEC_FLOAT(member, bit, none, lowest, highest, unread) float member = none;
#define LFCE_SPEC_FLAG(member, bit, absent, unread) bool member = false;
#include "compiler/spec_options.def"

  // Canonical text, e.g.
  // "lse_forward;V=128256;H=4096;chunk=0;mode=recompute;dtype=bf16;targets=i64;reduction=mean;
  //  bias=0;arch=sm_90a;tile=128x128x64/2x4/s3", then each option of spec_options.def that is not
  //  its default, in the table's order: ";softcap=30", ";temperature=0.7", ";class_weight=1", ...
  std::string text() const;
  static KernelSpec parse(std::string_view text);  // throws SpecError naming the bad field
  // Throws SpecError if the spec cannot be generated (sizes and their limits above, tile
  // ranges and shape, arch limits). Sizes the kind does not read may be 0.
  void validate() const;

  // The SpecField bits this spec's generated code depends on: its kind's, and for fp16
  // kernels that divide out dz_scale, the reduction (and the mode unless it is none).
  uint32_t fields_read() const;
  // This spec with every field its code does not read set to a fixed value (a default
  // KernelSpec's, sizes 0): specs that generate the same code normalise to the same value,
  // so they share one compile, one cache entry and one tuning.
  KernelSpec normalised() const;
  // This spec with every option (spec_options.def) its code does not read set to none, the other
  // fields as they are: a problem's options, each kernel keeping those it reads.
  KernelSpec read_options_only() const;

  auto tie() const {
    return std::tie(kind, vocab, hidden, chunk, mode, dtype, targets, reduction, bias, arch, tile
#define LFCE_SPEC_FLOAT(member, ...) , member
#define LFCE_SPEC_FLAG(member, ...) , member
#include "compiler/spec_options.def"
    );
  }
  bool operator==(const KernelSpec& o) const { return tie() == o.tie(); }
  bool operator!=(const KernelSpec& o) const { return !(*this == o); }
  bool operator<(const KernelSpec& o) const { return tie() < o.tie(); }
};

}  // namespace lfce
