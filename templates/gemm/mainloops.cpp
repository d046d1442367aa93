// The replaceable inner loops of the GEMM skeleton. Both read one BK-deep shared-memory
// slice of A and B per call and keep their accumulators in registers (fp32).
#include <llvm/IR/InlineAsm.h>

#include <string>
#include <vector>

#include "templates/gemm/gemm_skeleton.h"

namespace lfce {

using llvm::Value;

namespace {

// Tensor cores: mma.sync m16n8k16 (bf16 or fp16 in, fp32 accumulate), fragments loaded
// with ldmatrix (.trans for MN-major tiles). Warp (wm, wn) owns a WM x WN sub-tile.
class MmaSyncMainloop final : public Mainloop {
 public:
  MmaSyncMainloop(KernelBuilder& kb, const TileConfig& t, DType dtype, OperandTile a, OperandTile b)
      : kb_(kb), t_(t), bf16_(dtype == DType::BF16), a_(a), b_(b) {
    wm_ = t.bm / t.warps_m;
    wn_ = t.bn / t.warps_n;
    mi_ = wm_ / 16;
    ni_ = wn_ / 8;
  }

  void init() override {
    auto& ir = kb_.ir();
    acc_ = kb_.local_array(kb_.f32(), mi_ * ni_ * 4, "acc");
    for (int i = 0; i < mi_ * ni_ * 4; ++i) kb_.store(kb_.cf(0.f), kb_.at(acc_, kb_.f32(), i));
    Value* tid = kb_.tid();
    lane_ = ir.CreateAnd(tid, kb_.c32(31));
    Value* warp = ir.CreateLShr(tid, kb_.c32(5));
    warp_m0_ = ir.CreateMul(ir.CreateURem(warp, kb_.c32(t_.warps_m)), kb_.c32(wm_));
    warp_n0_ = ir.CreateMul(ir.CreateUDiv(warp, kb_.c32(t_.warps_m)), kb_.c32(wn_));
    // ldmatrix x4: lane l supplies the row address of matrix l/8, row l%8.
    Value* l8 = ir.CreateAnd(lane_, kb_.c32(7));
    Value* bit3 = ir.CreateMul(ir.CreateAnd(ir.CreateLShr(lane_, kb_.c32(3)), kb_.c32(1)), kb_.c32(8));
    Value* bit4 = ir.CreateMul(ir.CreateLShr(lane_, kb_.c32(4)), kb_.c32(8));
    // A fragment: matrices (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) (m8-15,k8-15).
    a_mn_ = ir.CreateAdd(l8, bit3);
    a_k_ = bit4;
    // B fragment pair (n-blocks j, j+1): (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15).
    b_mn_ = ir.CreateAdd(l8, bit4);
    b_k_ = bit3;
    if (a_.layout == Layout::MNMajor) {  // transposed load: lanes address k-rows instead
      a_mn_ = bit3;
      a_k_ = ir.CreateAdd(l8, bit4);
    }
    if (b_.layout == Layout::MNMajor) {
      b_mn_ = bit4;
      b_k_ = ir.CreateAdd(l8, bit3);
    }
  }

  void consume(Value* a_base, Value* b_base) override {
    auto& ir = kb_.ir();
    for (int ks = 0; ks < t_.bk; ks += 16) {
      std::vector<std::array<Value*, 4>> a(mi_);
      std::vector<std::array<Value*, 2>> b(ni_);
      for (int i = 0; i < mi_; ++i) {
        Value* mn = ir.CreateAdd(warp_m0_, ir.CreateAdd(a_mn_, kb_.c32(i * 16)));
        Value* k = ir.CreateAdd(a_k_, kb_.c32(ks));
        a[i] = kb_.ldmatrix_x4(kb_.smem(ir.CreateAdd(a_base, a_.offset(kb_, mn, k, 2))),
                               a_.layout == Layout::MNMajor);
      }
      for (int j = 0; j < ni_; j += 2) {
        Value* mn = ir.CreateAdd(warp_n0_, ir.CreateAdd(b_mn_, kb_.c32(j * 8)));
        Value* k = ir.CreateAdd(b_k_, kb_.c32(ks));
        auto r = kb_.ldmatrix_x4(kb_.smem(ir.CreateAdd(b_base, b_.offset(kb_, mn, k, 2))),
                                 b_.layout == Layout::MNMajor);
        b[j] = {r[0], r[1]};
        b[j + 1] = {r[2], r[3]};
      }
      for (int i = 0; i < mi_; ++i)
        for (int j = 0; j < ni_; ++j) {
          std::array<Value*, 4> c;
          for (int q = 0; q < 4; ++q) c[q] = kb_.load(kb_.f32(), slot(i, j, q));
          auto d = kb_.mma_16816(bf16_, a[i], b[j], c);
          for (int q = 0; q < 4; ++q) kb_.store(d[q], slot(i, j, q));
        }
    }
  }

  void store(const std::function<Value*(Value*, Value*)>& staged) override {
    auto& ir = kb_.ir();
    // Accumulator q of tile (i, j): row lane/4 (+8 for q >= 2), column 2·(lane%4) (+1 for odd q).
    Value* row0 = ir.CreateAdd(warp_m0_, ir.CreateLShr(lane_, kb_.c32(2)));
    Value* col0 = ir.CreateAdd(warp_n0_, ir.CreateMul(ir.CreateAnd(lane_, kb_.c32(3)), kb_.c32(2)));
    // One opaque base and constant offsets (the staged tile is row-major, BN + 1 floats per row):
    // separately computed addresses would be hoisted out of a template's tile loop and held in
    // registers through the mainloop.
    Value* base = kb_.opaque(staged(row0, col0));
    for (int i = 0; i < mi_; ++i)
      for (int j = 0; j < ni_; ++j)
        for (int q = 0; q < 4; ++q) {
          const int offset = ((i * 16 + (q / 2) * 8) * (t_.bn + 1) + j * 8 + q % 2) * 4;
          kb_.store(kb_.load(kb_.f32(), slot(i, j, q)), ir.CreateConstGEP1_32(ir.getInt8Ty(), base, offset));
        }
  }

 private:
  Value* slot(int i, int j, int q) { return kb_.at(acc_, kb_.f32(), (i * ni_ + j) * 4 + q); }

  KernelBuilder& kb_;
  TileConfig t_;
  bool bf16_;
  OperandTile a_, b_;
  int wm_, wn_, mi_, ni_;
  Value *acc_ = nullptr, *lane_ = nullptr, *warp_m0_ = nullptr, *warp_n0_ = nullptr;
  Value *a_mn_ = nullptr, *a_k_ = nullptr, *b_mn_ = nullptr, *b_k_ = nullptr;
};

// fp32 on CUDA cores: exact fp32 products (no TF32 rounding), each thread an outer-product
// micro-tile of rows ty + i·(threads/16), columns tx + 16·j.
class SimtMainloop final : public Mainloop {
 public:
  SimtMainloop(KernelBuilder& kb, const TileConfig& t, OperandTile a, OperandTile b)
      : kb_(kb), t_(t), a_(a), b_(b) {
    rows_step_ = t.threads() / 16;
    tm_ = t.bm / rows_step_;
    tn_ = t.bn / 16;
  }

  void init() override {
    auto& ir = kb_.ir();
    acc_ = kb_.local_array(kb_.f32(), tm_ * tn_, "acc");
    for (int i = 0; i < tm_ * tn_; ++i) kb_.store(kb_.cf(0.f), kb_.at(acc_, kb_.f32(), i));
    ty_ = ir.CreateUDiv(kb_.tid(), kb_.c32(16));
    tx_ = ir.CreateURem(kb_.tid(), kb_.c32(16));
  }

  void consume(Value* a_base, Value* b_base) override {
    auto& ir = kb_.ir();
    kb_.for_range(kb_.c32(0), kb_.c32(t_.bk), kb_.c32(1), [&](Value* k) {
      std::vector<Value*> a(tm_), b(tn_);
      for (int i = 0; i < tm_; ++i) {
        Value* m = ir.CreateAdd(ty_, kb_.c32(i * rows_step_));
        a[i] = kb_.load(kb_.f32(), kb_.smem(ir.CreateAdd(a_base, a_.offset(kb_, m, k, 4))));
      }
      for (int j = 0; j < tn_; ++j) {
        Value* n = ir.CreateAdd(tx_, kb_.c32(j * 16));
        b[j] = kb_.load(kb_.f32(), kb_.smem(ir.CreateAdd(b_base, b_.offset(kb_, n, k, 4))));
      }
      for (int i = 0; i < tm_; ++i)
        for (int j = 0; j < tn_; ++j) {
          Value* p = kb_.at(acc_, kb_.f32(), i * tn_ + j);
          Value* sum = ir.CreateIntrinsic(llvm::Intrinsic::fma, {kb_.f32()},
                                          {a[i], b[j], kb_.load(kb_.f32(), p)});
          kb_.store(sum, p);
        }
    });
  }

  void store(const std::function<Value*(Value*, Value*)>& staged) override {
    auto& ir = kb_.ir();
    for (int i = 0; i < tm_; ++i)
      for (int j = 0; j < tn_; ++j) {
        Value* r = ir.CreateAdd(ty_, kb_.c32(i * rows_step_));
        Value* c = ir.CreateAdd(tx_, kb_.c32(j * 16));
        kb_.store(kb_.load(kb_.f32(), kb_.at(acc_, kb_.f32(), i * tn_ + j)), staged(r, c));
      }
  }

 private:
  KernelBuilder& kb_;
  TileConfig t_;
  OperandTile a_, b_;
  int rows_step_, tm_, tn_;
  Value *acc_ = nullptr, *ty_ = nullptr, *tx_ = nullptr;
};

}  // namespace

std::function<void()> copy_narrow_piece(KernelBuilder& kb, Value* dst_offset, Value* src, Value* valid, int bytes) {
  auto& ir = kb.ir();
  Value* dst = kb.smem(dst_offset);
  if (bytes >= 4) {
    // cp.async.ca copies 4, 8 or 16 bytes (.cg only 16); src-size 0 zero-fills past the edges.
    // Inline PTX as for cp_async_16: LLVM 19 cannot select cp.async with 32-bit shared pointers.
    auto* type = llvm::FunctionType::get(ir.getVoidTy(), {kb.i32(), src->getType(), kb.i32()}, false);
    const std::string text = "cp.async.ca.shared.global [$0], [$1], " + std::to_string(bytes) + ", $2;";
    auto* copy = llvm::InlineAsm::get(type, text, "r,l,r,~{memory}", /*hasSideEffects=*/true);
    ir.CreateCall(copy, {ir.CreatePtrToInt(dst, kb.i32()), src, ir.CreateSelect(valid, kb.c32(bytes), kb.c32(0))});
    return {};
  }
  // One 16-bit element (odd H): cp.async has no 2-byte form, so a plain load, zero past the
  // edges (src is then the base: a readable address). The shared store lands before the barrier
  // that precedes this slice's use, the same barrier that publishes the cp.async copies.
  Value* value = ir.CreateSelect(valid, kb.load(ir.getInt16Ty(), src), ir.getInt16(0));
  return [&kb, value, dst] { kb.store(value, dst); };
}

std::unique_ptr<Mainloop> make_mainloop(KernelBuilder& kb, const TileConfig& tile, DType dtype,
                                        const OperandTile& a, const OperandTile& b) {
  if (dtype == DType::FP32) return std::make_unique<SimtMainloop>(kb, tile, a, b);
  return std::make_unique<MmaSyncMainloop>(kb, tile, dtype, a, b);
}

}  // namespace lfce
