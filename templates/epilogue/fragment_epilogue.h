// Epilogue pieces over a wgmma accumulator fragment in registers (templates/gemm/gemm_skeleton.h's
// Fragment), shared by the templates whose math is per element plus per-row reductions:
// reductions across the quad that holds a row, and the transposed store of a tile (tokens
// contiguous, as the dzᵀ workspace the gradient GEMMs read).
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "compiler/kernel_builder.h"
#include "templates/gemm/gemm_skeleton.h"

namespace lfce {

// Pairwise reduction tree of `values` with `op`: independent operations, not one dependent chain.
inline llvm::Value* reduce_tree(std::vector<llvm::Value*> values,
                                const std::function<llvm::Value*(llvm::Value*, llvm::Value*)>& op) {
  while (values.size() > 1) {
    std::vector<llvm::Value*> next;
    for (size_t i = 0; i + 1 < values.size(); i += 2) next.push_back(op(values[i], values[i + 1]));
    if (values.size() % 2) next.push_back(values.back());
    values = std::move(next);
  }
  return values[0];
}

// A row's value over the four lanes of its quad (lane % 4 varies, lane / 4 fixed), which hold
// its columns: `op` of the lanes' values, the same in every lane.
inline llvm::Value* quad_reduce(KernelBuilder& kb, llvm::Value* value,
                                const std::function<llvm::Value*(llvm::Value*, llvm::Value*)>& op) {
  for (int mask = 1; mask <= 2; mask *= 2) value = op(value, kb.shfl_xor(value, mask));
  return value;
}

// The tile's columns from this thread's col0 on that exist in an extent of `columns` (i64) for a
// tile at column n0: columns − n0 − col0 as i32 (at most the tile's width; negative past the end).
inline llvm::Value* columns_left(KernelBuilder& kb, const Fragment& f, llvm::Value* columns, llvm::Value* n0) {
  auto& ir = kb.ir();
  return ir.CreateTrunc(ir.CreateSub(ir.CreateSub(columns, n0), ir.CreateZExt(f.pos.col0, kb.i64())), kb.i32());
}

// Stores value(q, r) of every accumulator of `f` (row r = 0..rows-1 of the fragment, column
// q = 2j + e of this thread, i.e. tile column col0 + 8j + e), rounded to `elem`, transposed:
// element (row m[r], tile column c) at out[(n0 + c)·ld + m[r]], for rows below ld and columns
// below `columns` (i64, the extent of the output's columns).
// value() is called column by column, all rows of a column in order, so few values are live at
// once and a caller may carry per-row state through it (a select per element).
//
// This thread's two rows of an m64 block are 8 apart; the lane four away (lane ^ 4) holds the
// rows one below (upper = 1) or above. Each thread rounds its two rows of a column to one packed
// pair, and one shuffle and one byte permute give each of the two lanes two adjacent rows to
// store as one 4-byte pair: the lower lane rows (r, r + 1), the upper one (r + 8, r + 9), r even
// (ld is a multiple of 8, so a pair is wholly inside or outside [0, ld)).
inline void store_transposed_pairs(KernelBuilder& kb, const Fragment& f, const std::vector<llvm::Value*>& m,
                                   llvm::Value* n0, llvm::Value* out, llvm::Value* ld, llvm::Value* columns,
                                   llvm::Type* elem, const std::function<llvm::Value*(int q, int r)>& value) {
  auto& ir = kb.ir();
  const int rows = f.rows();
  llvm::Value* upper = ir.CreateICmpNE(ir.CreateAnd(f.pos.row[0], kb.c32(1)), kb.c32(0));
  // prmt of (mine, the other lane's): the lower lane takes both low halves, the upper lane
  // the other's high half, then its own.
  llvm::Value* selector = ir.CreateSelect(upper, kb.c32(0x3276), kb.c32(0x5410));
  std::vector<llvm::Value*> pair_row(rows / 2), pair_in_rows(rows / 2);
  for (int i = 0; i < rows / 2; ++i) {
    pair_row[i] = ir.CreateSelect(upper, ir.CreateSub(m[2 * i + 1], kb.c64(1)), m[2 * i]);
    pair_in_rows[i] = ir.CreateICmpSLT(pair_row[i], ld);
  }
  llvm::Type* pair_type = llvm::FixedVectorType::get(elem, 2);
  llvm::Type* wide = llvm::FixedVectorType::get(kb.f32(), 2);
  // The column's row of `out` advances by ld (e) and 8·ld (j) elements.
  llvm::Value* column = kb.gep(out, elem, ir.CreateMul(f.col_at(kb, n0, 0, 0), ld));
  llvm::Value* left = columns_left(kb, f, columns, n0);
  for (int q = 0; q < 2 * f.blocks(); ++q) {
    if (q > 0) column = kb.gep(column, elem, q % 2 ? ld : ir.CreateMul(ld, kb.c64(7)));
    llvm::Value* in_cols = ir.CreateICmpSLT(kb.c32(8 * (q / 2) + q % 2), left);
    for (int i = 0; i < rows / 2; ++i) {
      llvm::Value* exact = llvm::PoisonValue::get(wide);
      for (int h = 0; h < 2; ++h) exact = ir.CreateInsertElement(exact, value(q, 2 * i + h), uint64_t(h));
      llvm::Value* mine = ir.CreateBitCast(kb.from_f32(exact, pair_type), kb.i32());
      llvm::Value* pair = kb.prmt(mine, kb.shfl_xor_i32(mine, 4), selector);
      kb.store_if(ir.CreateAnd(pair_in_rows[i], in_cols), pair, kb.gep(column, elem, pair_row[i]));
    }
  }
}

}  // namespace lfce
