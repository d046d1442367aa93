#include "templates/gemm/gemm_skeleton.h"

#include <algorithm>
#include <vector>

#include "compiler/errors.h"
#include "templates/gemm/tile_scheduler.h"

namespace lfce {

using llvm::Value;

namespace {

int staging_row_floats(const TileConfig& t) { return t.bn + 1; }  // odd stride: no bank conflicts

OperandTile operand_tile(const TileConfig& t, DType dtype, Layout layout, int mn) {
  int e = dtype_bytes(dtype);
  SmemTile smem = layout == Layout::KMajor ? SmemTile{mn, t.bk * e} : SmemTile{t.bk, mn * e};
  return {smem, layout};
}

}  // namespace

Value* SmemTile::offset(KernelBuilder& kb, Value* row, Value* col, int elem_bytes) const {
  auto& ir = kb.ir();
  // 16-byte chunk index XOR (row mod 8): the 8 rows an ldmatrix phase reads land in 8
  // different 16-byte bank groups.
  Value* byte_in_row = ir.CreateMul(col, kb.c32(elem_bytes));
  Value* chunk = ir.CreateLShr(byte_in_row, kb.c32(4));
  Value* swizzled = ir.CreateXor(chunk, ir.CreateAnd(row, kb.c32(7)));
  Value* within = ir.CreateAnd(byte_in_row, kb.c32(15));
  return ir.CreateAdd(ir.CreateMul(row, kb.c32(row_bytes)),
                      ir.CreateAdd(ir.CreateShl(swizzled, kb.c32(4)), within));
}

std::vector<Param> gemm_params(const TileConfig& tile, std::vector<Param> params) {
  if (tile.wgmma()) {
    params.push_back({"tma_a", ParamType::TensorMap});
    params.push_back({"tma_b", ParamType::TensorMap});
  }
  return params;
}

GemmSkeleton::GemmSkeleton(KernelBuilder& kb, const KernelSpec& spec)
    : kb_(kb),
      tile_(spec.tile),
      dtype_(spec.dtype),
      transform_(spec.eager_operand),
      layouts_{kind_info(spec.kind).a, kind_info(spec.kind).b} {
  if (!kind_info(spec.kind).gemm) throw InternalError("GemmSkeleton for " + spec.text() + ", which is not a GEMM");
  if (tile_.wgmma()) {
    pipeline_ = make_wgmma_pipeline(kb, tile_, dtype_, layouts_[0], layouts_[1]);
    return;
  }
  if (transform_) throw InternalError("an operand transform needs the sm_90a pipeline (tile " + tile_.text() + ")");
  mainloop_ = make_mainloop(kb, tile_, dtype_, operand_tile(tile_, dtype_, layouts_[0], tile_.bm),
                            operand_tile(tile_, dtype_, layouts_[1], tile_.bn));
}

GemmSkeleton::~GemmSkeleton() = default;

int gemm_smem_bytes(const TileConfig& tile, DType dtype, Layout a, Layout b, int extra_bytes) {
  if (tile.wgmma()) return wgmma_smem_bytes(tile, dtype) + extra_bytes;
  int ring = tile.stages * (operand_tile(tile, dtype, a, tile.bm).smem.bytes() +
                            operand_tile(tile, dtype, b, tile.bn).smem.bytes());
  int staging = tile.bm * staging_row_floats(tile) * 4;
  return (std::max(ring, staging) + 15) / 16 * 16 + extra_bytes;
}

int GemmSkeleton::extra_offset() const { return gemm_smem_bytes(tile_, dtype_, layouts_[0], layouts_[1]); }

Value* GemmSkeleton::blocks_for(Value* extent, int tile) {
  auto& ir = kb_.ir();
  return ir.CreateTrunc(ir.CreateUDiv(ir.CreateAdd(extent, kb_.c64(tile - 1)), kb_.c64(tile)), kb_.i32());
}

Value* GemmSkeleton::k_tiles_for(Value* k_extent) {
  auto& ir = kb_.ir();
  Value* tiles = ir.CreateSDiv(ir.CreateAdd(k_extent, kb_.c64(tile_.bk - 1)), kb_.c64(tile_.bk));
  return ir.CreateTrunc(tiles, kb_.i32());
}

void GemmSkeleton::load_stage(const GemmOperand& op, int which, Value* slot_base, Value* mn0, Value* kt) {
  auto& ir = kb_.ir();
  const int e = dtype_bytes(dtype_);
  const int piece = op.row_align;  // bytes per copy: 16 unless the operand's rows are narrower
  const int vec = piece / e;
  OperandTile t = operand_tile(tile_, dtype_, op.layout, which == 0 ? tile_.bm : tile_.bn);
  const int chunks_per_row = t.smem.row_bytes / piece;
  const int total = t.smem.rows * chunks_per_row;
  llvm::Type* elem = ir.getInt8Ty();
  Value* k0 = ir.CreateMul(ir.CreateSExt(kt, kb_.i64()), kb_.c64(tile_.bk));
  Value* tid = kb_.tid();
  auto copy = [&](Value* id) -> std::function<void()> {
    Value* row = ir.CreateUDiv(id, kb_.c32(chunks_per_row));
    Value* col = ir.CreateMul(ir.CreateURem(id, kb_.c32(chunks_per_row)), kb_.c32(vec));  // elements
    // Stored-matrix coordinates: rows run along the slow global dimension.
    Value* slow = ir.CreateAdd(op.layout == Layout::KMajor ? mn0 : k0, ir.CreateZExt(row, kb_.i64()));
    Value* fast = ir.CreateAdd(op.layout == Layout::KMajor ? k0 : mn0, ir.CreateZExt(col, kb_.i64()));
    Value* slow_ext = op.layout == Layout::KMajor ? op.mn_extent : op.k_extent;
    Value* fast_ext = op.layout == Layout::KMajor ? op.k_extent : op.mn_extent;
    Value* valid = ir.CreateAnd(ir.CreateICmpSLT(slow, slow_ext), ir.CreateICmpSLT(fast, fast_ext));
    // 64-bit element offset: N·V and V·H exceed 2^31 at realistic sizes.
    Value* index = ir.CreateAdd(ir.CreateMul(slow, op.ld), fast);
    Value* byte_index = ir.CreateSelect(valid, ir.CreateMul(index, kb_.c64(e)), kb_.c64(0));
    Value* src = kb_.gep(op.base, elem, byte_index);
    Value* dst_offset = ir.CreateAdd(slot_base, t.smem.offset(kb_, row, col, e));
    // Rows not 16-byte aligned (odd H): narrower copies, same ring and edges.
    if (piece < 16) return copy_narrow_piece(kb_, dst_offset, src, valid, piece);
    Value* dst = kb_.smem(dst_offset);
    if (total % kb_.threads() != 0) {
      kb_.if_then(ir.CreateICmpULT(id, kb_.c32(total)),
                  [&] { kb_.cp_async_16(dst, src, ir.CreateSelect(valid, kb_.c32(16), kb_.c32(0))); });
    } else {
      kb_.cp_async_16(dst, src, ir.CreateSelect(valid, kb_.c32(16), kb_.c32(0)));
    }
    return {};
  };
  if (piece < 16) {
    // A run-time loop over the 2-8x more pieces: fully unrolled, each piece's address would be
    // hoisted out of the mainloop and held in registers through it (spills). Element loads,
    // which are not asynchronous, come kNarrowBatch an iteration, all issued before their
    // shared stores, so their latencies overlap.
    const int batch = piece == e && total % (kNarrowBatch * kb_.threads()) == 0 ? kNarrowBatch : 1;
    kb_.for_range(tid, kb_.c32(total), kb_.c32(batch * kb_.threads()), [&](Value* first) {
      std::vector<std::function<void()>> finish;
      for (int b = 0; b < batch; ++b) finish.push_back(copy(ir.CreateAdd(first, kb_.c32(b * kb_.threads()))));
      for (const auto& store : finish)
        if (store) store();
    });
    return;
  }
  for (int i = 0; i < total; i += kb_.threads()) copy(ir.CreateAdd(tid, kb_.c32(i)));
}

void GemmSkeleton::compute_tile(const GemmOperand& a, const GemmOperand& b, Value* m0, Value* n0,
                                Value* k_tiles) {
  if (transform_) throw InternalError("an operand transform needs run_persistent (tile " + tile_.text() + ")");
  if (pipeline_) {
    pipeline_->compute_tile(m0, n0, k_tiles, [&](Value* r, Value* c) { return staged(r, c); });
    return;
  }
  auto& ir = kb_.ir();
  const int stages = tile_.stages;
  const int a_bytes = operand_tile(tile_, dtype_, a.layout, tile_.bm).smem.bytes();
  const int stage_bytes = a_bytes + operand_tile(tile_, dtype_, b.layout, tile_.bn).smem.bytes();
  auto slot_base = [&](Value* kt) {
    return ir.CreateMul(ir.CreateURem(kt, kb_.c32(stages)), kb_.c32(stage_bytes));
  };
  auto load = [&](Value* kt) {
    Value* base = slot_base(kt);
    load_stage(a, 0, base, m0, kt);
    load_stage(b, 1, ir.CreateAdd(base, kb_.c32(a_bytes)), n0, kt);
  };

  // The previous tile's staged epilogue may still be reading the same bytes.
  kb_.barrier();
  mainloop_->init();
  // Prologue: stages-1 slices in flight. Every slot commits a group, even an empty one, so
  // wait_group(stages-2) below always means "slice kt has landed".
  for (int s = 0; s < stages - 1; ++s) {
    kb_.if_then(ir.CreateICmpSLT(kb_.c32(s), k_tiles), [&] { load(kb_.c32(s)); });
    kb_.cp_async_commit();
  }
  kb_.for_range(kb_.c32(0), k_tiles, kb_.c32(1), [&](Value* kt) {
    kb_.cp_async_wait(stages - 2);
    // Slice kt is visible to all threads, and everyone is done with slice kt-1, whose slot
    // the next copy overwrites.
    kb_.barrier();
    Value* next = ir.CreateAdd(kt, kb_.c32(stages - 1));
    kb_.if_then(ir.CreateICmpSLT(next, k_tiles), [&] { load(next); });
    kb_.cp_async_commit();
    Value* base = slot_base(kt);
    mainloop_->consume(base, ir.CreateAdd(base, kb_.c32(a_bytes)));
  });
  kb_.cp_async_wait(0);
  kb_.barrier();  // the staged tile overwrites the ring
  mainloop_->store([&](Value* r, Value* c) { return staged(r, c); });
  kb_.barrier();
}

void GemmSkeleton::run_specialised(const TileSchedule& schedule, const OperandTransform* transform,
                                   const ProducerWork* work) {
  if ((transform != nullptr) != transform_)
    throw InternalError("an operand transform " + std::string(transform ? "given" : "missing") + " for a kernel planned " +
                        (transform_ ? "with" : "without") + " one (tile " + tile_.text() + ")");
  pipeline_->run(schedule, transform, work);
}

void GemmSkeleton::run_persistent(Value* grid_m, Value* grid_n, Value* k_tiles, const TileEpilogue& epilogue,
                                  const OperandTransform* transform, const ProducerWork* work) {
  if (transform && tile_.cluster != 1)
    throw InternalError("an operand transform on a clustered tile (" + tile_.text() + ")");
  const TileScheduler scheduler(tile_);
  const TileScheduler::Walk tiles = scheduler.prepare(kb_, grid_m, grid_n);
  run_specialised([&](bool, const TileVisit& visit) {
    scheduler.walk(kb_, tiles, [&](Value* m0, Value* n0) {
      visit(m0, n0, k_tiles, [&](const Fragment& f) { epilogue(m0, n0, f); });
    });
  }, transform, work);
}

FragmentPosition GemmSkeleton::fragment_position() { return pipeline_->fragment_position(); }

Value* GemmSkeleton::staged(Value* r, Value* c) {
  auto& ir = kb_.ir();
  Value* index = ir.CreateAdd(ir.CreateMul(r, kb_.c32(staging_row_floats(tile_))), c);
  return kb_.smem(ir.CreateMul(index, kb_.c32(4)));
}

void GemmSkeleton::for_each_element(bool rows_fastest, const std::function<void(Value*, Value*)>& body) {
  auto& ir = kb_.ir();
  // A run-time loop, not an unrolled one: epilogues are small next to the mainloop, and
  // unrolling BM·BN/threads copies of them only bloats the PTX.
  kb_.for_range(kb_.tid(), kb_.c32(tile_.bm * tile_.bn), kb_.c32(kb_.threads()), [&](Value* id) {
    Value* r = rows_fastest ? ir.CreateURem(id, kb_.c32(tile_.bm)) : ir.CreateUDiv(id, kb_.c32(tile_.bn));
    Value* c = rows_fastest ? ir.CreateUDiv(id, kb_.c32(tile_.bm)) : ir.CreateURem(id, kb_.c32(tile_.bn));
    body(r, c);
  });
}

}  // namespace lfce
