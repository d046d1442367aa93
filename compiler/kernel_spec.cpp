#include "compiler/kernel_spec.h"

#include <array>
#include <charconv>
#include <cstdlib>
#include <map>
#include <sstream>
#include <utility>

#include "compiler/errors.h"

namespace lfce {
std::string float_text(float value) {
  char buffer[32];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return error == std::errc() ? std::string(buffer, end) : std::string("?");
}

namespace {

template <typename E>
using NameTable = std::initializer_list<std::pair<E, std::string_view>>;

const NameTable<DType> kDTypes = {{DType::BF16, "bf16"}, {DType::FP16, "fp16"}, {DType::FP32, "fp32"}};
const NameTable<IndexType> kIndexTypes = {{IndexType::I64, "i64"}, {IndexType::I32, "i32"}};
const NameTable<Reduction> kReductions = {
    {Reduction::Mean, "mean"}, {Reduction::Sum, "sum"}, {Reduction::None, "none"}};
const NameTable<Mode> kModes = {{Mode::Recompute, "recompute"}, {Mode::Eager, "eager"}};

template <typename E>
std::string_view name_of(const NameTable<E>& table, E value) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  throw InternalError("KernelSpec: enum value without a name");
}

template <typename E>
E value_of(const NameTable<E>& table, std::string_view field, std::string_view name) {
  std::string accepted;
  for (const auto& [v, n] : table) {
    if (n == name) return v;
    accepted += (accepted.empty() ? "" : ", ") + std::string(n);
  }
  throw SpecError("KernelSpec field '" + std::string(field) + "' has value '" + std::string(name) +
                  "'; expected one of " + accepted);
}

int64_t parse_int(std::string_view field, std::string_view text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw SpecError("KernelSpec field '" + std::string(field) + "' is not an integer: '" +
                    std::string(text) + "'");
  return value;
}

}  // namespace

std::string_view dtype_name(DType dtype) { return name_of(kDTypes, dtype); }
std::string_view reduction_name(Reduction reduction) { return name_of(kReductions, reduction); }
std::string_view mode_name(Mode mode) { return name_of(kModes, mode); }
int dtype_bytes(DType dtype) { return dtype == DType::FP32 ? 4 : 2; }

int hidden_row_align(int64_t hidden, DType dtype) {
  const int64_t row_bytes = hidden * dtype_bytes(dtype);
  for (int piece : {16, 8, 4})
    if (row_bytes % piece == 0) return piece;
  return dtype_bytes(dtype);
}

std::string TileConfig::text() const {
  std::ostringstream out;
  out << bm << 'x' << bn << 'x' << bk << '/';
  if (wgmma())
    out << "wg" << consumers;
  else
    out << warps_m << 'x' << warps_n;
  out << "/s" << stages;
  if (cluster != 1) out << "/c" << cluster << (cluster_n ? "n" : "");
  if (pingpong) out << "/pp";
  if (split_n) out << "/sn";
  return out.str();
}

TileConfig TileConfig::parse(std::string_view text) {
  TileConfig t;
  auto bad = [&] {
    return SpecError("tile must read BMxBNxBK/WMxWN/sSTAGES or BMxBNxBK/wgC/sSTAGES[/cCLUSTER[n]][/pp][/sn], got '" +
                     std::string(text) + "'");
  };
  char x1, x2, slash1, slash2, s;
  std::istringstream in{std::string(text)};
  in >> t.bm >> x1 >> t.bn >> x2 >> t.bk >> slash1;
  if (!in || x1 != 'x' || x2 != 'x' || slash1 != '/') throw bad();
  if (in.peek() == 'w') {
    char w, g;
    in >> w >> g >> t.consumers;
    if (!in || w != 'w' || g != 'g' || t.consumers < 1) throw bad();
    t.warps_m = t.warps_n = 1;
  } else {
    char x3;
    in >> t.warps_m >> x3 >> t.warps_n;
    if (!in || x3 != 'x') throw bad();
  }
  in >> slash2 >> s >> t.stages;
  if (!in || slash2 != '/' || s != 's') throw bad();
  // Optional wgmma suffixes, in this order: /cN or /cNn (cluster, along M or N), /pp (ping-pong),
  // /sn (split along N).
  std::string rest;
  std::getline(in, rest, '\0');
  if (!rest.empty() && !t.wgmma()) throw bad();
  auto suffix = [&](const char* text3) {
    if (rest.size() < 3 || rest.compare(rest.size() - 3, 3, text3) != 0) return false;
    rest.resize(rest.size() - 3);
    return true;
  };
  t.split_n = suffix("/sn");
  t.pingpong = suffix("/pp");
  if (!rest.empty()) {
    t.cluster_n = rest.size() == 4 && rest[3] == 'n';
    if (rest.size() != (t.cluster_n ? 4u : 3u) || rest[0] != '/' || rest[1] != 'c' || rest[2] < '1' || rest[2] > '9')
      throw bad();
    t.cluster = rest[2] - '0';
  }
  return t;
}

std::string KernelSpec::text() const {
  std::ostringstream out;
  out << kind_name(kind) << ";V=" << vocab << ";H=" << hidden << ";chunk=" << chunk
      << ";mode=" << mode_name(mode) << ";dtype=" << dtype_name(dtype)
      << ";targets=" << name_of(kIndexTypes, targets) << ";reduction=" << reduction_name(reduction)
      << ";bias=" << (bias ? 1 : 0) << ";arch=" << arch_name(arch) << ";tile=" << tile.text();
#define LFCE_SPEC_FLOAT(member, bit, none, ...) \
  if (member != none) out << ";" #member "=" << float_text(member);
#define LFCE_SPEC_FLAG(member, ...) \
  if (member) out << ";" #member "=1";
#include "compiler/spec_options.def"
  return out.str();
}

KernelSpec KernelSpec::parse(std::string_view text) {
  KernelSpec spec;
  std::map<std::string, std::string, std::less<>> fields;
  size_t pos = 0;
  bool first = true;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(pos, end - pos);
    if (first) {
      spec.kind = parse_kind(item);
      first = false;
    } else {
      size_t eq = item.find('=');
      if (eq == std::string_view::npos)
        throw SpecError("KernelSpec item '" + std::string(item) + "' is not NAME=VALUE");
      if (!fields.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1))).second)
        throw SpecError("KernelSpec field '" + std::string(item.substr(0, eq)) + "' appears twice");
    }
    pos = end + 1;
  }
  auto take = [&](std::string_view name) {
    auto it = fields.find(name);
    if (it == fields.end()) throw SpecError("KernelSpec text lacks field '" + std::string(name) + "'");
    std::string value = it->second;
    fields.erase(it);
    return value;
  };
  spec.vocab = parse_int("V", take("V"));
  spec.hidden = parse_int("H", take("H"));
  spec.chunk = parse_int("chunk", take("chunk"));
  spec.mode = value_of(kModes, "mode", take("mode"));
  spec.dtype = value_of(kDTypes, "dtype", take("dtype"));
  spec.targets = value_of(kIndexTypes, "targets", take("targets"));
  spec.reduction = value_of(kReductions, "reduction", take("reduction"));
  std::string bias = take("bias");
  if (bias != "0" && bias != "1") throw SpecError("KernelSpec field 'bias' must be 0 or 1, got '" + bias + "'");
  spec.bias = bias == "1";
  spec.arch = parse_arch(take("arch"));
  try {
    spec.tile = TileConfig::parse(take("tile"));
  } catch (const SpecError& e) {
    throw SpecError(std::string("KernelSpec field 'tile': ") + e.what());
  }
  // Optional fields, present only where they are not the default (the value in `value`).
  auto take_float = [&](const char* name, float& value) {
    if (!fields.count(name)) return;
    const std::string text = take(name);
    const float none = value;
    char* end = nullptr;
    value = std::strtof(text.c_str(), &end);
    if (text.empty() || *end != '\0' || float_text(value) != text || value == none)
      throw SpecError(std::string("KernelSpec field '") + name + "' must be a float in canonical form other than " +
                      float_text(none) + " (none: no field), got '" + text + "'");
  };
  // Flags: "1" when set, no field otherwise.
  auto take_flag = [&](const char* name, bool& value, const char* unset) {
    if (!fields.count(name)) return;
    const std::string text = take(name);
    if (text != "1")
      throw SpecError(std::string("KernelSpec field '") + name + "' must be 1 (" + unset + ": no field), got '" + text +
                      "'");
    value = true;
  };
#define LFCE_SPEC_FLOAT(member, ...) take_float(#member, spec.member);
#define LFCE_SPEC_FLAG(member, bit, absent, unread) take_flag(#member, spec.member, absent);
#include "compiler/spec_options.def"
  if (!fields.empty()) throw SpecError("KernelSpec has unknown field '" + fields.begin()->first + "'");
  return spec;
}

void TileConfig::check_range() const {
  auto in_range = [](int value, const char* field, int limit) {
    if (value < 1 || value > limit)
      throw SpecError(std::string("tile ") + field + " = " + std::to_string(value) + " is outside 1.." +
                      std::to_string(limit));
  };
  in_range(bm, "BM", kMaxDim);
  in_range(bn, "BN", kMaxDim);
  in_range(bk, "BK", kMaxDim);
  in_range(warps_m, "warps_m", kMaxWarps);
  in_range(warps_n, "warps_n", kMaxWarps);
  in_range(stages, "stages", kMaxStages);
  if (consumers < 0 || consumers > kMaxConsumers)
    throw SpecError("tile consumers = " + std::to_string(consumers) + " is outside 0.." + std::to_string(kMaxConsumers));
  in_range(cluster, "cluster", kMaxCluster);
  if (cluster_n && cluster == 1)
    throw SpecError("tile " + text() + " with cluster_n (\"/c1n\"): pairing along N needs a cluster of 2 or more CTAs");
}

void KernelSpec::validate() const {
  auto fail = [&](const std::string& what) { throw SpecError(what + " (in " + text() + ")"); };
  auto bounded = [&](int64_t value, const char* field, int64_t lowest, int64_t limit) {
    if (value < lowest || value > limit)
      fail(std::string(field) + " = " + std::to_string(value) + " is outside " + std::to_string(lowest) + ".." +
           std::to_string(limit));
  };
  const KernelKindInfo& info = kind_info(kind);
  const uint32_t reads = fields_read();
  // Sizes the code reads must be >= 1; the others are 0 once normalised.
  auto size_floor = [&](uint32_t field) { return (reads & field) ? 1 : 0; };
  bounded(vocab, "vocab", size_floor(kFieldVocab), kMaxVocab);
  bounded(hidden, "hidden", size_floor(kFieldHidden), kMaxHidden);
  bounded(chunk, "chunk", size_floor(kFieldChunk), kMaxChunk);
  // The loss options: in range (a NaN fails both comparisons), and set only where they are code.
  auto option = [&](float value, const char* name, float lowest, float limit, float none, uint32_t field,
                    const char* unread) {
    if (!(value >= lowest && value <= limit))
      fail(std::string(name) + " = " + float_text(value) + " is outside " + float_text(lowest) + " .. " +
           float_text(limit) + " (" + float_text(none) + ": none)");
    if (value != none && !(reads & field)) fail(std::string(name) + " is set on a kernel that " + unread);
  };
  // Two options a kind reads only with others (fields_read()): said so where they are set alone.
  if (class_weight && kind == KernelKind::LseForward && !(reads & kFieldClassWeight))
    fail("class_weight is set on lse_forward without label smoothing (it reads the class weights only for the "
         "smoothing term)");
  if (token_scaling && kind == KernelKind::LossReduce && !(reads & kFieldTokenScaling))
    fail("token_scaling is set on loss_reduce without class weights, a z-loss and mean (it reads the scale only to "
         "split the z-loss out)");
  auto flag = [&](bool value, const char* name, uint32_t field, const char* unread) {
    if (value && !(reads & field)) fail(std::string(name) + " is set on a kernel that " + unread);
  };
#define LFCE_SPEC_FLOAT(member, bit, none, lowest, highest, unread) \
  option(member, #member, lowest, highest, none, bit, unread);
#define LFCE_SPEC_FLAG(member, bit, absent, unread) flag(member, #member, bit, unread);
#include "compiler/spec_options.def"
  if (eager_operand &&
      (dtype == DType::FP32 || (info.gemm && (!tile.wgmma() || tile.cluster != 1 || tile.split_n || arch != Arch::SM90A))))
    fail("eager_operand needs a 16-bit dtype and, on a GEMM, an unclustered, unsplit sm_90a wgmma tile (its transform "
         "runs in the TMA pipeline; a split consumer's two m64 blocks of fragments spill), got " + std::string(dtype_name(dtype)) + ", tile " + tile.text() + " on " +
         std::string(arch_name(arch)));
  if (eager_fixup && (eager_operand || dtype == DType::FP32 || !tile.wgmma() || arch != Arch::SM90A))
    fail("eager_fixup needs a 16-bit dtype and an sm_90a wgmma tile without eager_operand (its fix-up runs in the TMA "
         "pipeline's producer warpgroup), got " + std::string(dtype_name(dtype)) + ", tile " + tile.text() + " on " +
         std::string(arch_name(arch)) + (eager_operand ? " with eager_operand" : ""));
  // The lse rows' gradients are not scaled for fp16 (their size is unknown: dz_scale would not fit).
  if (lse_grad && dtype == DType::FP16) fail("lse_grad needs bf16 or fp32, got fp16");
  if (!info.gemm) return;
  const ArchInfo& limits = arch_info(arch);
  const TileConfig& t = tile;
  try {
    t.check_range();
  } catch (const SpecError& e) {
    fail(e.what());
  }
  if (t.wgmma()) {
    // TMA boxes and wgmma descriptors of the 128-byte-swizzled layout: BK = 64 16-bit elements
    // (one 128-byte row), each consumer warpgroup owns whole m64 blocks of rows (64 x consumers
    // rows in all, or a 64- or 128-row tile of its own with ping-pong), BN in whole 64-element
    // boxes up to wgmma's N = 256.
    if (arch != Arch::SM90A) fail("the wgmma mainloop (tile " + t.text() + ") needs arch sm_90a");
    if (dtype == DType::FP32) fail("the wgmma mainloop (tile " + t.text() + ") takes bf16 or fp16, not fp32");
    if (t.bk != 64) fail("wgmma tiles need BK = 64 (one 128-byte swizzled row), got " + std::to_string(t.bk));
    if (t.pingpong && t.split_n) fail("tile " + t.text() + " is both ping-pong and split along N: choose one");
    if (t.pingpong) {
      if (kind == KernelKind::LseForward)
        fail("tile " + t.text() + ": ping-pong serves the persistent backward GEMMs, not lse_forward");
      if (t.consumers != 2 || (t.bm != 64 && t.bm != 128))
        fail("ping-pong tiles need two consumers and BM = 64 or 128 (each consumer's own tile), got " + t.text());
    } else if (t.split_n) {
      // Each consumer: all BM rows (m64 blocks) of its BN / 2 columns; B's halves start on whole
      // 64-element boxes where B is MN-major (grad_weight, grad_input), on 8-row atoms otherwise.
      if (kind == KernelKind::LseForward || kind == KernelKind::EagerLogits)
        fail("tile " + t.text() + ": split tiles serve the persistent backward GEMMs, not " + std::string(info.name) +
             " (whose row statistics need every column of a row in one consumer)");
      if (t.consumers != 2 || t.bm % 64 != 0 || t.bm > 256)
        fail("split tiles need two consumers and BM a multiple of 64 up to 256, got " + t.text());
      if (t.cluster != 1) fail("tile " + t.text() + ": split tiles have no CTA pairs");
      if (info.b == Layout::MNMajor && t.consumer_cols() % 64 != 0)
        fail("tile " + t.text() + ": " + std::string(info.name) + " reads B MN-major, so each consumer's BN / 2 = " +
             std::to_string(t.consumer_cols()) + " columns must be whole 64-element boxes");
    } else if (t.bm != 64 * t.consumers) {
      fail("wgmma tiles need BM = 64 x consumers = " + std::to_string(64 * t.consumers) + ", got " +
           std::to_string(t.bm));
    }
    if (t.bn % 64 != 0 || t.bn > 256) fail("wgmma tiles need BN a multiple of 64 up to 256, got " + std::to_string(t.bn));
    // Every consumer thread holds its m64 blocks' accumulators through the mainloop (the
    // register file gives a consumer at most 240 per thread, and the epilogue needs its own).
    if (t.accumulators() > TileConfig::kMaxAccumulators)
      fail("tile " + t.text() + " gives each consumer thread " + std::to_string(t.accumulators()) +
           " fp32 accumulators, over " + std::to_string(TileConfig::kMaxAccumulators) + " (BM / 64 per consumer x BN / 2)");
    if (t.stages < 2) fail("wgmma tiles need at least 2 stages, got " + std::to_string(t.stages));
    if (t.warps_m != 1 || t.warps_n != 1) fail("wgmma tiles have warps 1x1 (the warpgroups are fixed), got " + t.text());
    if (t.cluster > 1) {
      // The pair walks the persistent tile schedule together, each CTA multicasting half of the
      // B tile: whole 64-row boxes each (MN-major B), and half boxes of whole swizzle atoms.
      if (kind == KernelKind::LseForward)
        fail("tile " + t.text() + ": clusters serve the persistent backward GEMMs, not lse_forward");
      if (t.cluster_n) {  // each CTA multicasts its share of A instead, under the same rule
        if (kind != KernelKind::GradWeight && kind != KernelKind::GradInput)
          fail("tile " + t.text() + ": clusters along N serve grad_weight and grad_input, not " + std::string(info.name));
        if (t.bm % (64 * t.cluster) != 0)
          fail("tile " + t.text() + ": a cluster of " + std::to_string(t.cluster) + " along N needs BM a multiple of " +
               std::to_string(64 * t.cluster) + ", got " + std::to_string(t.bm));
      } else if (t.bn % (64 * t.cluster) != 0) {
        fail("tile " + t.text() + ": a cluster of " + std::to_string(t.cluster) + " needs BN a multiple of " +
             std::to_string(64 * t.cluster) + ", got " + std::to_string(t.bn));
      }
    }
    // TMA needs global row strides that are multiples of 16 bytes; hidden and weight rows are H
    // elements (no padded copy is made): other H run the mma.sync mainloop (runtime/plan.cpp).
    if (hidden_row_align(hidden, dtype) < 16)
      fail("the wgmma mainloop (tile " + t.text() + ") loads rows of hidden = " + std::to_string(hidden) + " " +
           std::string(dtype_name(dtype)) + " elements (" + std::to_string(hidden * dtype_bytes(dtype)) +
           " bytes) with TMA, which needs a multiple of 16 bytes; use an mma.sync tile");
    return;
  }
  if (t.cluster != 1 || t.pingpong)
    fail("tile " + t.text() + ": clusters and ping-pong need a wgmma tile (the mma.sync mainloop has neither)");
  if (t.threads() > limits.threads_per_block_max)
    fail("tile warps " + std::to_string(t.warps_m) + "x" + std::to_string(t.warps_n) + " make " +
         std::to_string(t.threads()) + " threads, over the limit of " + std::to_string(limits.threads_per_block_max));
  // 16-bit: warps tile the CTA in 16x16 ldmatrix blocks; fp32 (SIMT): 16 thread columns.
  bool fits = dtype == DType::FP32
                  ? t.threads() % 16 == 0 && t.bm % (t.threads() / 16) == 0 && t.bn % 16 == 0
                  : t.bm % (t.warps_m * 16) == 0 && t.bn % (t.warps_n * 16) == 0;
  if (!fits)
    fail("tile " + std::to_string(t.bm) + "x" + std::to_string(t.bn) +
         " does not split evenly over " + std::to_string(t.warps_m) + "x" + std::to_string(t.warps_n) +
         " warps");
  if (info.thread_per_row && t.bm > t.threads())
    fail("tile BM = " + std::to_string(t.bm) + " exceeds the " + std::to_string(t.threads()) +
         " threads of the CTA, which " + std::string(info.name) + " needs one per row");
  // Swizzled 16-byte chunks need rows of at least 128 bytes in every operand layout.
  int min_rows = 128 / dtype_bytes(dtype);
  if (t.bk < min_rows || t.bk % min_rows != 0 || t.bm % min_rows != 0 || t.bn % min_rows != 0)
    fail("tile dimensions must be multiples of " + std::to_string(min_rows) + " for " +
         std::string(dtype_name(dtype)));
}

uint32_t KernelSpec::fields_read() const {
  const KernelKindInfo& info = kind_info(kind);
  uint32_t reads = info.reads;
  // dz_scale (templates/template_util.h) is 1 unless fp16 with a mean or sum reduction, where
  // it reads grad_loss only in recompute mode.
  if (info.unscales_dz && dtype == DType::FP16)
    reads |= kFieldReduction | (reduction == Reduction::None ? 0u : uint32_t{kFieldMode});
  if (info.adds_target_term && dtype != DType::FP32) reads |= kFieldTargets;
  // The causal shift is part of reading a target (load_target).
  if (reads & kFieldTargets) reads |= kFieldShift;
  // lse_forward reads the class weights only for label smoothing's weighted logit sum;
  // loss_reduce the z-loss only for "mean" with class weights (the z-loss's own denominator).
  if (kind == KernelKind::LseForward && label_smoothing == 0.f) reads &= ~uint32_t{kFieldClassWeight};
  if (kind == KernelKind::LossReduce && !(class_weight && reduction == Reduction::Mean))
    reads &= ~uint32_t{kFieldZLoss};
  // ... and the token scale only where it splits the (scaled) z-loss out.
  if (kind == KernelKind::LossReduce && !(class_weight && reduction == Reduction::Mean && z_loss_scale != 0.f))
    reads &= ~uint32_t{kFieldTokenScaling};
  // The target terms need V: eps / V, and the bound of a target whose class weight is read.
  // dlogits_backward reads the entropy and logprob rows only for their gradients (lse_grad).
  if (kind == KernelKind::DlogitsBackward && !lse_grad) reads &= ~kOutputFields;
  if ((kind == KernelKind::DlogitsBackward && (label_smoothing != 0.f || class_weight || (lse_grad && logprob))) ||
      ((kind == KernelKind::LossReduce || kind == KernelKind::TokenCount || kind == KernelKind::EagerDz) &&
       class_weight))
    reads |= kFieldVocab;
  return reads;
}

KernelSpec KernelSpec::normalised() const {
  const uint32_t reads = fields_read();
  KernelSpec out;
  out.kind = kind;
  out.arch = arch;
  out.vocab = (reads & kFieldVocab) ? vocab : 0;
  out.hidden = (reads & kFieldHidden) ? hidden : 0;
  out.chunk = (reads & kFieldChunk) ? chunk : 0;
  if (reads & kFieldMode) out.mode = mode;
  if (reads & kFieldDType) out.dtype = dtype;
  if (reads & kFieldTargets) out.targets = targets;
  if (reads & kFieldReduction) out.reduction = reduction;
  if (reads & kFieldBias) out.bias = bias;
  if (reads & kFieldTile) out.tile = tile;
#define LFCE_SPEC_FLOAT(member, bit, ...) \
  if (reads & bit) out.member = member;
#define LFCE_SPEC_FLAG(member, bit, ...) \
  if (reads & bit) out.member = member;
#include "compiler/spec_options.def"
  return out;
}

KernelSpec KernelSpec::read_options_only() const {
  // fields_read() depends on some options (lse_forward reads the class weights only with label
  // smoothing, ...): clear until no option is set that the code does not read.
  KernelSpec out = *this;
  for (KernelSpec last; last != out;) {
    last = out;
    const uint32_t reads = out.fields_read();
#define LFCE_SPEC_FLOAT(member, bit, none, ...) \
  if (!(reads & bit)) out.member = none;
#define LFCE_SPEC_FLAG(member, bit, ...) \
  if (!(reads & bit)) out.member = false;
#include "compiler/spec_options.def"
  }
  return out;
}

}  // namespace lfce
