// A thin layer over LLVM's IRBuilder for writing NVPTX kernels: kernel signature and
// annotations, special registers, shared memory, structured control flow, and the
// NVVM intrinsics the templates use. The templates read as CUDA would, one level down.
#pragma once

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "compiler/kernel_signature.h"

namespace lfce {

// One parameter as a template declares it (ParamType: compiler/kernel_signature.h).
struct Param {
  std::string name;
  ParamType type;
  bool noalias = true;  // false where the caller may pass the same buffer twice
};

class KernelBuilder {
 public:
  // Creates `name` in `module` with `threads` threads per CTA (emitted as .maxntid).
  KernelBuilder(llvm::Module& module, const std::string& name, const std::vector<Param>& params,
                int threads);

  llvm::IRBuilder<>& ir() { return ir_; }
  llvm::LLVMContext& ctx() { return module_.getContext(); }
  llvm::Value* arg(const std::string& name) const;
  // The parameters' names and types, in order: what the template's KernelShape returns, so
  // that the runtime binds arguments by these names.
  const KernelSignature& signature() const { return signature_; }
  int threads() const { return threads_; }
  // .minnctapersm: ptxas keeps registers low enough for `ctas` CTAs per SM.
  void set_min_ctas_per_sm(int ctas);
  void finish();  // terminates the kernel

  // Types.
  llvm::Type* f32() { return ir_.getFloatTy(); }
  llvm::Type* i32() { return ir_.getInt32Ty(); }
  llvm::Type* i64() { return ir_.getInt64Ty(); }
  llvm::Value* c32(int64_t v) { return ir_.getInt32(static_cast<uint32_t>(v)); }
  llvm::Value* c64(int64_t v) { return ir_.getInt64(static_cast<uint64_t>(v)); }
  llvm::Value* cf(float v);

  // Thread and CTA coordinates (i32).
  llvm::Value* tid();
  llvm::Value* ctaid(int dim);
  llvm::Value* nctaid(int dim);

  // Dynamic shared memory: byte offset (i32) -> addrspace(3) pointer.
  llvm::Value* smem(llvm::Value* byte_offset);
  llvm::Value* smem(int64_t byte_offset) { return smem(c32(byte_offset)); }
  void barrier();

  // Global memory: element `index` (i64) of a pointer argument viewed as `elem`.
  llvm::Value* gep(llvm::Value* base, llvm::Type* elem, llvm::Value* index);
  llvm::Value* load(llvm::Type* type, llvm::Value* ptr) { return ir_.CreateLoad(type, ptr); }
  void store(llvm::Value* value, llvm::Value* ptr) { ir_.CreateStore(value, ptr); }
  // A 32-bit global store predicated on `cond` (i1): one predicated instruction, no branch.
  void store_if(llvm::Value* cond, llvm::Value* value_i32, llvm::Value* global_ptr);

  // Per-thread arrays promoted to registers by SROA when indexed by constants.
  llvm::Value* local_array(llvm::Type* elem, int count, const std::string& name);
  llvm::Value* at(llvm::Value* array, llvm::Type* elem, int index);

  // Structured control flow.
  void if_then(llvm::Value* cond, const std::function<void()>& then_body);
  void if_then_else(llvm::Value* cond, const std::function<void()>& then_body,
                    const std::function<void()>& else_body);
  // for (iv = begin; iv < end; iv += step) body(iv); integer type taken from `begin`.
  void for_range(llvm::Value* begin, llvm::Value* end, llvm::Value* step,
                 const std::function<void(llvm::Value*)>& body);
  // while (cond()) body(); cond emits its i1 in the loop's header, each trip.
  void while_loop(const std::function<llvm::Value*()>& cond, const std::function<void()>& body);
  // A value chosen by a branch, without a select on possibly-poison inputs.
  llvm::Value* select(llvm::Value* cond, llvm::Value* a, llvm::Value* b) { return ir_.CreateSelect(cond, a, b); }

  // Math.
  llvm::Value* exp(llvm::Value* x);  // e^x through ex2.approx
  llvm::Value* exp2(llvm::Value* x);  // 2^x: ex2.approx (the SFU instruction, 2 ulp)
  llvm::Value* fma(llvm::Value* a, llvm::Value* b, llvm::Value* c);  // a·b + c, rounded once
  static constexpr float kLog2e = 1.4426950408889634f;
  llvm::Value* log(llvm::Value* x);  // ln x through lg2.approx
  // a / b with div.full.f32 (2 ulp, no subroutine call in SASS, unlike the IEEE division).
  llvm::Value* div_full(llvm::Value* a, llvm::Value* b);
  llvm::Value* fmax(llvm::Value* a, llvm::Value* b);
  llvm::Value* shfl_xor(llvm::Value* value, int lane_mask);  // f32 butterfly across a warp
  llvm::Value* shfl_xor_i32(llvm::Value* value, int lane_mask);  // the same for 32 bits of anything
  llvm::Value* vote_any(llvm::Value* predicate);  // i1: whether it holds in any lane of the (whole) warp
  // prmt.b32: byte k of the result is byte (selector >> 4k) & 7 of {b, a} (a: bytes 0-3).
  llvm::Value* prmt(llvm::Value* a, llvm::Value* b, llvm::Value* selector);
  llvm::Value* warp_max(llvm::Value* x);
  llvm::Value* warp_sum(llvm::Value* x);
  llvm::Value* to_f32(llvm::Value* value);                     // bf16/half/float -> float
  llvm::Value* from_f32(llvm::Value* value, llvm::Type* type);  // float -> bf16/half/float (RN)

  // Asynchronous global -> shared copies (sm_80).
  void cp_async_16(llvm::Value* smem_ptr, llvm::Value* global_ptr, llvm::Value* src_bytes);
  void cp_async_commit();
  void cp_async_wait(int pending_groups);

  // Hopper (sm_90a), as inline PTX (LLVM 19 has no intrinsics for these).
  // The generic address of a TensorMap parameter, for TMA instructions.
  llvm::Value* tensor_map(const std::string& name);
  // 32-bit shared-window address of dynamic shared memory byte `offset`.
  llvm::Value* smem_addr(llvm::Value* byte_offset);
  // mbarriers at shared byte offsets (i32, 8-byte aligned).
  void mbarrier_init(llvm::Value* bar, int arrivals);
  void mbarrier_init_fence();  // makes initialised mbarriers visible to TMA and other threads
  // fence.proxy.async.shared::cta: this thread's earlier generic-proxy shared-memory accesses are
  // ordered before later async-proxy (TMA) ones, e.g. before TMA overwrites what was read.
  void fence_proxy_async();
  void mbarrier_arrive(llvm::Value* bar);
  void mbarrier_arrive_expect_tx(llvm::Value* bar, int bytes);
  void mbarrier_wait(llvm::Value* bar, llvm::Value* parity);  // spins until phase `parity` completed
  // 2-D TMA tile load of box (c0 inner, c1 outer) into shared byte offset `dst`, completing
  // its bytes on mbarrier `bar`. Coordinates are i32 elements; out-of-bounds reads zero-fill.
  void tma_load_2d(llvm::Value* dst, llvm::Value* map, llvm::Value* c0, llvm::Value* c1, llvm::Value* bar);
  // The same box written to shared byte offset `dst` of every CTA of the cluster in `cta_mask`
  // (i16), completing its bytes on mbarrier `bar` of each of them.
  void tma_load_2d_multicast(llvm::Value* dst, llvm::Value* map, llvm::Value* c0, llvm::Value* c1,
                             llvm::Value* bar, llvm::Value* cta_mask);

  // Thread-block clusters (launched with a cluster shape: runtime/module.h).
  llvm::Value* cluster_rank();  // i32: %cluster_ctarank
  // Arrives on mbarrier `bar` (shared byte offset) of the cluster's CTA `rank` (i32), which may
  // be this one: release at CTA scope, as CUTLASS's cluster barriers do (a consumer handing a
  // slot back after its wgmmas have read it). Cluster scope made each arrival a cluster-wide
  // fence that waited for the warp's global stores: eager's grad_weight on CTA pairs 1.7x slower,
  // its warps stalled on MEMBAR (docs/measurements.md#cta-pairs).
  void mbarrier_arrive_cluster(llvm::Value* bar, llvm::Value* rank);
  // barrier.cluster arrive (release) + wait (acquire) by every thread of every CTA of the
  // cluster: initialised mbarriers are visible to the peers after it, and no CTA leaves while
  // a peer may still write to its shared memory before it.
  void cluster_sync();
  // The same shared-memory pointer, through an inline-PTX move with side effects: address
  // arithmetic on it stays where it is written (not hoisted out of loops into registers).
  llvm::Value* opaque(llvm::Value* smem_ptr);
  // The same i32, opaque to LLVM's loop analyses: values derived from it are not turned into
  // induction variables that stay live (in registers) across a whole loop body.
  llvm::Value* opaque_i32(llvm::Value* value);
  llvm::Value* opaque_i64(llvm::Value* value);  // the same for an i64
  // bar.warp.sync: the warp's lanes reconverge (before .sync.aligned instructions that follow
  // a branch taken by some lanes only).
  void warp_sync();
  // setmaxnreg: every warp of the warpgroup moves to `registers` per thread (a multiple of 8
  // in 24..256); inc waits until the registers other warpgroups released are free.
  void set_max_registers(bool increase, int registers);
  // Named barrier `id` (1..15) over `threads` threads (a multiple of 32).
  void named_barrier(int id, int threads);
  // Cross-CTA hand-offs through global memory (eager grad_weight's in-kernel fix-up): an i32
  // counter at `global_ptr` (a global pointer). atomic_add_i32 returns the old value (relaxed,
  // GPU scope); add_release_i32 adds after this thread's earlier writes (red.release.gpu);
  // load_acquire_i32 reads it before this thread's later accesses (ld.acquire.gpu).
  llvm::Value* atomic_add_i32(llvm::Value* global_ptr, llvm::Value* value);
  void add_release_i32(llvm::Value* global_ptr, llvm::Value* value);
  llvm::Value* load_acquire_i32(llvm::Value* global_ptr);
  // fence.proxy.async (every state space): this thread's generic-proxy accesses are ordered
  // with its async-proxy (TMA) ones, e.g. global data it saw written before a TMA load of it.
  void fence_proxy_async_all();
  // 16 bytes (<4 x i32>) at a 16-byte aligned global pointer, cache-streaming (ld/st.global.cs:
  // evict-first in L2, for data touched once while a GEMM keeps its operands there).
  llvm::Value* load_streaming_v4(llvm::Value* global_ptr);
  void store_streaming_v4(llvm::Value* global_ptr, llvm::Value* value);
  void nanosleep(int nanoseconds);
  llvm::Value* shfl_idx_i32(llvm::Value* value, int lane);  // lane `lane`'s value in every lane
  // wgmma.mma_async m64nNk16 (f32 accumulate) from shared-memory descriptors a, b (i64):
  // acc (N/2 floats per thread) += A·B. trans_*: the operand is MN-major in shared memory.
  std::vector<llvm::Value*> wgmma_m64k16(bool bf16, int n, llvm::Value* desc_a, llvm::Value* desc_b,
                                         const std::vector<llvm::Value*>& acc, bool trans_a, bool trans_b);
  // The same with A from registers (wgmma's RS form): a[0..3] are the thread's four 32-bit
  // pairs of the m64k16 A fragment, in mma.m16n8k16's A order (rows r and r + 8 of the warp's
  // 16, columns 2·(lane % 4) + {0, 1} then + 8), the low half the lower column. Every write of
  // them must come before a wgmma_fence that precedes this.
  std::vector<llvm::Value*> wgmma_m64k16_rs(bool bf16, int n, const std::array<llvm::Value*, 4>& a,
                                            llvm::Value* desc_b, const std::vector<llvm::Value*>& acc, bool trans_b);
  void wgmma_fence();
  void wgmma_commit();
  // wgmma.wait_group with every accumulator register tied through it, so that no read of them
  // is scheduled before the wait.
  std::vector<llvm::Value*> wgmma_wait(int pending, const std::vector<llvm::Value*>& acc);

  // Tensor cores (sm_80): ldmatrix x4 and mma.sync m16n8k16 with f32 accumulators.
  std::array<llvm::Value*, 4> ldmatrix_x4(llvm::Value* smem_ptr, bool transpose);
  std::array<llvm::Value*, 4> mma_16816(bool bf16, const std::array<llvm::Value*, 4>& a,
                                        const std::array<llvm::Value*, 2>& b,
                                        const std::array<llvm::Value*, 4>& c);

 private:
  llvm::CallInst* call(llvm::Intrinsic::ID id, llvm::ArrayRef<llvm::Value*> args,
                       llvm::ArrayRef<llvm::Type*> overloads = {});
  llvm::Value* sreg(llvm::Intrinsic::ID id);
  // Inline PTX with side effects, marked convergent (for .sync.aligned forms).
  llvm::CallInst* ptx(llvm::Type* ret, const std::string& text, const std::string& constraints,
                      llvm::ArrayRef<llvm::Value*> args);

  llvm::Module& module_;
  llvm::IRBuilder<> ir_;
  llvm::Function* fn_;
  llvm::BasicBlock* entry_;
  llvm::GlobalVariable* smem_;
  int threads_;
  KernelSignature signature_;
};

}  // namespace lfce
