#include "compiler/kernel_builder.h"

#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "compiler/errors.h"

namespace lfce {

using llvm::Value;

KernelBuilder::KernelBuilder(llvm::Module& module, const std::string& name,
                             const std::vector<Param>& params, int threads)
    : module_(module), ir_(module.getContext()), threads_(threads) {
  llvm::LLVMContext& c = module.getContext();
  std::vector<llvm::Type*> types;
  for (const Param& p : params) {
    for (const KernelParam& earlier : signature_)
      if (earlier.name == p.name) throw InternalError(name + " declares the parameter " + p.name + " twice");
    signature_.push_back({p.name, p.type});
    switch (p.type) {
      case ParamType::GlobalPtr: types.push_back(llvm::PointerType::get(c, 1)); break;
      case ParamType::I64: types.push_back(llvm::Type::getInt64Ty(c)); break;
      case ParamType::I32: types.push_back(llvm::Type::getInt32Ty(c)); break;
      case ParamType::F32: types.push_back(llvm::Type::getFloatTy(c)); break;
      case ParamType::TensorMap: types.push_back(llvm::PointerType::get(c, 0)); break;
    }
  }
  auto* type = llvm::FunctionType::get(llvm::Type::getVoidTy(c), types, false);
  fn_ = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, module);
  fn_->setCallingConv(llvm::CallingConv::PTX_Kernel);
  for (size_t i = 0; i < params.size(); ++i) {
    fn_->getArg(i)->setName(params[i].name);
    if (params[i].type == ParamType::GlobalPtr && params[i].noalias)
      fn_->addParamAttr(i, llvm::Attribute::NoAlias);  // lets NVPTX use ld.global.nc
    if (params[i].type == ParamType::TensorMap) {
      auto* map_type = llvm::ArrayType::get(llvm::Type::getInt8Ty(c), 128);
      fn_->addParamAttr(i, llvm::Attribute::getWithByValType(c, map_type));
      fn_->addParamAttr(i, llvm::Attribute::getWithAlignment(c, llvm::Align(64)));
    }
  }
  // LLVM 19 takes launch bounds only through nvvm.annotations; .maxntid also lets ptxas
  // budget registers for exactly this many threads.
  auto* md = module.getOrInsertNamedMetadata("nvvm.annotations");
  auto annotate = [&](const char* key, int value) {
    md->addOperand(llvm::MDNode::get(
        c, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(c, key),
            llvm::ValueAsMetadata::get(llvm::ConstantInt::get(llvm::Type::getInt32Ty(c), value))}));
  };
  annotate("kernel", 1);
  annotate("maxntidx", threads);
  // Without grid_constant LLVM 19 copies a byval parameter to local memory, where TMA cannot
  // read it; with it, the parameter's address is taken in place (cvta.param).
  std::vector<llvm::Metadata*> grid_constants;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].type == ParamType::TensorMap)
      grid_constants.push_back(llvm::ValueAsMetadata::get(
          llvm::ConstantInt::get(llvm::Type::getInt32Ty(c), static_cast<int>(i) + 1)));  // 1-based
  if (!grid_constants.empty())
    md->addOperand(llvm::MDNode::get(c, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(c, "grid_constant"),
                                         llvm::MDNode::get(c, grid_constants)}));

  smem_ = module.getGlobalVariable("lfce_smem");
  if (!smem_) {
    auto* array = llvm::ArrayType::get(llvm::Type::getInt8Ty(c), 0);
    smem_ = new llvm::GlobalVariable(module, array, false, llvm::GlobalValue::ExternalLinkage, nullptr,
                                     "lfce_smem", nullptr, llvm::GlobalValue::NotThreadLocal, 3);
    smem_->setAlignment(llvm::Align(1024));
  }
  entry_ = llvm::BasicBlock::Create(c, "entry", fn_);
  ir_.SetInsertPoint(entry_);
}

Value* KernelBuilder::arg(const std::string& name) const {
  for (llvm::Argument& a : fn_->args())
    if (a.getName() == name) return &a;
  throw InternalError("KernelBuilder: no parameter named " + name);
}

void KernelBuilder::set_min_ctas_per_sm(int ctas) {
  llvm::LLVMContext& c = module_.getContext();
  module_.getOrInsertNamedMetadata("nvvm.annotations")
      ->addOperand(llvm::MDNode::get(
          c, {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(c, "minctasm"),
              llvm::ValueAsMetadata::get(llvm::ConstantInt::get(llvm::Type::getInt32Ty(c), ctas))}));
}

void KernelBuilder::finish() { ir_.CreateRetVoid(); }

Value* KernelBuilder::cf(float v) { return llvm::ConstantFP::get(f32(), v); }

llvm::CallInst* KernelBuilder::call(llvm::Intrinsic::ID id, llvm::ArrayRef<Value*> args,
                                    llvm::ArrayRef<llvm::Type*> overloads) {
  llvm::Function* f = llvm::Intrinsic::getDeclaration(&module_, id, overloads);
  return ir_.CreateCall(f, args);
}

Value* KernelBuilder::sreg(llvm::Intrinsic::ID id) { return call(id, {}); }

Value* KernelBuilder::tid() { return sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x); }

Value* KernelBuilder::ctaid(int dim) {
  static const llvm::Intrinsic::ID ids[] = {llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x,
                                            llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y,
                                            llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z};
  return sreg(ids[dim]);
}

Value* KernelBuilder::nctaid(int dim) {
  static const llvm::Intrinsic::ID ids[] = {llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x,
                                            llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_y,
                                            llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_z};
  return sreg(ids[dim]);
}

Value* KernelBuilder::smem(Value* byte_offset) {
  return ir_.CreateGEP(ir_.getInt8Ty(), smem_, byte_offset);
}

void KernelBuilder::barrier() {
  call(llvm::Intrinsic::nvvm_barrier0, {})->addFnAttr(llvm::Attribute::Convergent);
}

Value* KernelBuilder::gep(Value* base, llvm::Type* elem, Value* index) {
  return ir_.CreateGEP(elem, base, index);
}

Value* KernelBuilder::local_array(llvm::Type* elem, int count, const std::string& name) {
  llvm::IRBuilder<> at_entry(entry_, entry_->begin());
  return at_entry.CreateAlloca(llvm::ArrayType::get(elem, count), nullptr, name);
}

Value* KernelBuilder::at(Value* array, llvm::Type* elem, int index) {
  auto* type = llvm::ArrayType::get(elem, llvm::cast<llvm::AllocaInst>(array)->getAllocatedType()->getArrayNumElements());
  return ir_.CreateConstInBoundsGEP2_32(type, array, 0, index);
}

void KernelBuilder::if_then(Value* cond, const std::function<void()>& then_body) {
  llvm::LLVMContext& c = ctx();
  auto* then_bb = llvm::BasicBlock::Create(c, "then", fn_);
  auto* done_bb = llvm::BasicBlock::Create(c, "endif", fn_);
  ir_.CreateCondBr(cond, then_bb, done_bb);
  ir_.SetInsertPoint(then_bb);
  then_body();
  ir_.CreateBr(done_bb);
  ir_.SetInsertPoint(done_bb);
}

void KernelBuilder::if_then_else(Value* cond, const std::function<void()>& then_body,
                                 const std::function<void()>& else_body) {
  llvm::LLVMContext& c = ctx();
  auto* then_bb = llvm::BasicBlock::Create(c, "then", fn_);
  auto* else_bb = llvm::BasicBlock::Create(c, "else", fn_);
  auto* done_bb = llvm::BasicBlock::Create(c, "endif", fn_);
  ir_.CreateCondBr(cond, then_bb, else_bb);
  ir_.SetInsertPoint(then_bb);
  then_body();
  ir_.CreateBr(done_bb);
  ir_.SetInsertPoint(else_bb);
  else_body();
  ir_.CreateBr(done_bb);
  ir_.SetInsertPoint(done_bb);
}

void KernelBuilder::for_range(Value* begin, Value* end, Value* step,
                              const std::function<void(Value*)>& body) {
  llvm::LLVMContext& c = ctx();
  llvm::BasicBlock* pre = ir_.GetInsertBlock();
  auto* header = llvm::BasicBlock::Create(c, "loop", fn_);
  auto* body_bb = llvm::BasicBlock::Create(c, "body", fn_);
  auto* exit = llvm::BasicBlock::Create(c, "endloop", fn_);
  ir_.CreateBr(header);
  ir_.SetInsertPoint(header);
  llvm::PHINode* iv = ir_.CreatePHI(begin->getType(), 2, "iv");
  iv->addIncoming(begin, pre);
  ir_.CreateCondBr(ir_.CreateICmpSLT(iv, end), body_bb, exit);
  ir_.SetInsertPoint(body_bb);
  body(iv);
  Value* next = ir_.CreateAdd(iv, step);
  iv->addIncoming(next, ir_.GetInsertBlock());
  ir_.CreateBr(header);
  ir_.SetInsertPoint(exit);
}

void KernelBuilder::while_loop(const std::function<Value*()>& cond, const std::function<void()>& body) {
  llvm::LLVMContext& c = ctx();
  auto* header = llvm::BasicBlock::Create(c, "while", fn_);
  auto* body_bb = llvm::BasicBlock::Create(c, "while_body", fn_);
  auto* exit = llvm::BasicBlock::Create(c, "endwhile", fn_);
  ir_.CreateBr(header);
  ir_.SetInsertPoint(header);
  ir_.CreateCondBr(cond(), body_bb, exit);
  ir_.SetInsertPoint(body_bb);
  body();
  ir_.CreateBr(header);
  ir_.SetInsertPoint(exit);
}

Value* KernelBuilder::exp(Value* x) {
  // e^x = 2^(x·log2 e); ex2.approx is the SFU instruction, 2 ulp.
  return exp2(ir_.CreateFMul(x, cf(kLog2e)));
}

Value* KernelBuilder::exp2(Value* x) { return call(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {x}); }

Value* KernelBuilder::fma(Value* a, Value* b, Value* c) { return call(llvm::Intrinsic::fma, {a, b, c}, {a->getType()}); }

Value* KernelBuilder::div_full(Value* a, Value* b) {
  auto* type = llvm::FunctionType::get(f32(), {f32(), f32()}, false);
  return ir_.CreateCall(llvm::InlineAsm::get(type, "div.full.f32 $0, $1, $2;", "=f,f,f", /*hasSideEffects=*/false),
                        {a, b});
}

Value* KernelBuilder::log(Value* x) {
  return ir_.CreateFMul(call(llvm::Intrinsic::nvvm_lg2_approx_f, {x}), cf(0.6931471805599453f));
}

Value* KernelBuilder::fmax(Value* a, Value* b) {
  return call(llvm::Intrinsic::maxnum, {a, b}, {a->getType()});
}

Value* KernelBuilder::shfl_xor(Value* value, int lane_mask) {
  auto* ci = call(llvm::Intrinsic::nvvm_shfl_sync_bfly_f32, {c32(-1), value, c32(lane_mask), c32(31)});
  ci->addFnAttr(llvm::Attribute::Convergent);
  return ci;
}

void KernelBuilder::store_if(Value* cond, Value* value_i32, Value* global_ptr) {
  ptx(ir_.getVoidTy(), "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $0, 0;\n\t@p st.global.b32 [$1], $2;\n\t}",
      "r,l,r,~{memory}", {ir_.CreateZExt(cond, i32()), global_ptr, value_i32});
}

Value* KernelBuilder::shfl_xor_i32(Value* value, int lane_mask) {
  auto* ci = call(llvm::Intrinsic::nvvm_shfl_sync_bfly_i32, {c32(-1), value, c32(lane_mask), c32(31)});
  ci->addFnAttr(llvm::Attribute::Convergent);
  return ci;
}

Value* KernelBuilder::vote_any(Value* predicate) {
  auto* ci = call(llvm::Intrinsic::nvvm_vote_any_sync, {c32(-1), predicate});
  ci->addFnAttr(llvm::Attribute::Convergent);
  return ci;
}

Value* KernelBuilder::prmt(Value* a, Value* b, Value* selector) { return call(llvm::Intrinsic::nvvm_prmt, {a, b, selector}); }

Value* KernelBuilder::warp_max(Value* x) {
  for (int m = 16; m > 0; m /= 2) x = fmax(x, shfl_xor(x, m));
  return x;
}

Value* KernelBuilder::warp_sum(Value* x) {
  for (int m = 16; m > 0; m /= 2) x = ir_.CreateFAdd(x, shfl_xor(x, m));
  return x;
}

Value* KernelBuilder::to_f32(Value* value) {
  return value->getType()->isFloatTy() ? value : ir_.CreateFPExt(value, f32());
}

Value* KernelBuilder::from_f32(Value* value, llvm::Type* type) {
  return type->isFloatTy() ? value : ir_.CreateFPTrunc(value, type);
}

void KernelBuilder::cp_async_16(Value* smem_ptr, Value* global_ptr, Value* src_bytes) {
  // src_bytes < 16 zero-fills the rest: predicated-off tile edges read as zeros.
  // Inline PTX: LLVM 19 cannot select the cp.async intrinsic with 32-bit shared pointers.
  auto* type = llvm::FunctionType::get(ir_.getVoidTy(), {i32(), global_ptr->getType(), i32()}, false);
  auto* asm_ = llvm::InlineAsm::get(type, "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                                    /*hasSideEffects=*/true);
  ir_.CreateCall(asm_, {ir_.CreatePtrToInt(smem_ptr, i32()), global_ptr, src_bytes});
}

void KernelBuilder::cp_async_commit() { call(llvm::Intrinsic::nvvm_cp_async_commit_group, {}); }

void KernelBuilder::cp_async_wait(int pending_groups) {
  call(llvm::Intrinsic::nvvm_cp_async_wait_group, {c32(pending_groups)});
}

llvm::CallInst* KernelBuilder::ptx(llvm::Type* ret, const std::string& text, const std::string& constraints,
                                   llvm::ArrayRef<Value*> args) {
  std::vector<llvm::Type*> types;
  for (Value* a : args) types.push_back(a->getType());
  auto* type = llvm::FunctionType::get(ret, types, false);
  llvm::CallInst* ci = ir_.CreateCall(llvm::InlineAsm::get(type, text, constraints, /*hasSideEffects=*/true), args);
  ci->addFnAttr(llvm::Attribute::Convergent);
  return ci;
}

Value* KernelBuilder::tensor_map(const std::string& name) {
  // The byval parameter's address is in the param space; generic addressing reaches it
  // (LLVM emits cvta.param for grid_constant parameters).
  return ir_.CreatePtrToInt(arg(name), i64());
}

Value* KernelBuilder::smem_addr(Value* byte_offset) { return ir_.CreatePtrToInt(smem(byte_offset), i32()); }

void KernelBuilder::mbarrier_init(Value* bar, int arrivals) {
  ptx(ir_.getVoidTy(), "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", {smem_addr(bar), c32(arrivals)});
}

void KernelBuilder::mbarrier_init_fence() {
  ptx(ir_.getVoidTy(), "fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;", "~{memory}", {});
}

void KernelBuilder::fence_proxy_async() {
  ptx(ir_.getVoidTy(), "fence.proxy.async.shared::cta;", "~{memory}", {});
}

void KernelBuilder::mbarrier_arrive(Value* bar) {
  ptx(ir_.getVoidTy(), "{\n\t.reg .b64 state;\n\tmbarrier.arrive.release.cta.shared::cta.b64 state, [$0];\n\t}",
      "r,~{memory}", {smem_addr(bar)});
}

void KernelBuilder::mbarrier_arrive_expect_tx(Value* bar, int bytes) {
  ptx(ir_.getVoidTy(),
      "{\n\t.reg .b64 state;\n\tmbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [$0], $1;\n\t}",
      "r,r,~{memory}", {smem_addr(bar), c32(bytes)});
}

void KernelBuilder::mbarrier_wait(Value* bar, Value* parity) {
  // try_wait suspends the thread for a system-dependent time; loop until the phase completed.
  ptx(ir_.getVoidTy(),
      "{\n\t.reg .pred done;\n\tLFCE_WAIT_${:uid}:\n\t"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [$0], $1;\n\t"
      "@!done bra LFCE_WAIT_${:uid};\n\t}",
      "r,r,~{memory}", {smem_addr(bar), parity});
}

void KernelBuilder::tma_load_2d(Value* dst, Value* map, Value* c0, Value* c1, Value* bar) {
  ptx(ir_.getVoidTy(),
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$0], [$1, {$2, $3}], [$4];",
      "r,l,r,r,r,~{memory}", {smem_addr(dst), map, c0, c1, smem_addr(bar)});
}

void KernelBuilder::tma_load_2d_multicast(Value* dst, Value* map, Value* c0, Value* c1, Value* bar,
                                          Value* cta_mask) {
  ptx(ir_.getVoidTy(),
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[$0], [$1, {$2, $3}], [$4], $5;",
      "r,l,r,r,r,h,~{memory}", {smem_addr(dst), map, c0, c1, smem_addr(bar), cta_mask});
}

Value* KernelBuilder::cluster_rank() { return ptx(i32(), "mov.u32 $0, %cluster_ctarank;", "=r", {}); }

void KernelBuilder::mbarrier_arrive_cluster(Value* bar, Value* rank) {
  ptx(ir_.getVoidTy(),
      "{\n\t.reg .b32 remote;\n\tmapa.shared::cluster.u32 remote, $0, $1;\n\t"
      "mbarrier.arrive.release.cta.shared::cluster.b64 _, [remote];\n\t}",
      "r,r,~{memory}", {smem_addr(bar), rank});
}

void KernelBuilder::cluster_sync() {
  ptx(ir_.getVoidTy(), "barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;", "~{memory}", {});
}

Value* KernelBuilder::opaque(Value* smem_ptr) {
  Value* moved = ptx(i32(), "mov.b32 $0, $1;", "=r,r", {ir_.CreatePtrToInt(smem_ptr, i32())});
  return ir_.CreateIntToPtr(moved, smem_ptr->getType());
}

Value* KernelBuilder::opaque_i32(Value* value) { return ptx(i32(), "mov.b32 $0, $1;", "=r,r", {value}); }

Value* KernelBuilder::opaque_i64(Value* value) { return ptx(i64(), "mov.b64 $0, $1;", "=l,l", {value}); }

Value* KernelBuilder::atomic_add_i32(Value* global_ptr, Value* value) {
  return ptx(i32(), "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r,~{memory}",
             {ir_.CreatePtrToInt(global_ptr, i64()), value});
}

void KernelBuilder::add_release_i32(Value* global_ptr, Value* value) {
  ptx(ir_.getVoidTy(), "red.release.gpu.global.add.u32 [$0], $1;", "l,r,~{memory}",
      {ir_.CreatePtrToInt(global_ptr, i64()), value});
}

Value* KernelBuilder::load_acquire_i32(Value* global_ptr) {
  return ptx(i32(), "ld.acquire.gpu.global.u32 $0, [$1];", "=r,l,~{memory}", {ir_.CreatePtrToInt(global_ptr, i64())});
}

Value* KernelBuilder::load_streaming_v4(Value* global_ptr) {
  auto* i32x4 = llvm::StructType::get(ctx(), {i32(), i32(), i32(), i32()});
  Value* s = ptx(i32x4, "ld.global.cs.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l,~{memory}",
                 {ir_.CreatePtrToInt(global_ptr, i64())});
  Value* v = llvm::PoisonValue::get(llvm::FixedVectorType::get(i32(), 4));
  for (unsigned i = 0; i < 4; ++i) v = ir_.CreateInsertElement(v, ir_.CreateExtractValue(s, {i}), uint64_t(i));
  return v;
}

void KernelBuilder::store_streaming_v4(Value* global_ptr, Value* value) {
  std::vector<Value*> args = {ir_.CreatePtrToInt(global_ptr, i64())};
  for (unsigned i = 0; i < 4; ++i) args.push_back(ir_.CreateExtractElement(value, uint64_t(i)));
  ptx(ir_.getVoidTy(), "st.global.cs.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r,~{memory}", args);
}

void KernelBuilder::fence_proxy_async_all() { ptx(ir_.getVoidTy(), "fence.proxy.async;", "~{memory}", {}); }

void KernelBuilder::nanosleep(int nanoseconds) {
  ptx(ir_.getVoidTy(), "nanosleep.u32 " + std::to_string(nanoseconds) + ";", "~{memory}", {});
}

Value* KernelBuilder::shfl_idx_i32(Value* value, int lane) {
  auto* ci = call(llvm::Intrinsic::nvvm_shfl_sync_idx_i32, {c32(-1), value, c32(lane), c32(31)});
  ci->addFnAttr(llvm::Attribute::Convergent);
  return ci;
}

void KernelBuilder::warp_sync() {
  call(llvm::Intrinsic::nvvm_bar_warp_sync, {c32(-1)})->addFnAttr(llvm::Attribute::Convergent);
}

void KernelBuilder::set_max_registers(bool increase, int registers) {
  call(increase ? llvm::Intrinsic::nvvm_setmaxnreg_inc_sync_aligned_u32
                : llvm::Intrinsic::nvvm_setmaxnreg_dec_sync_aligned_u32,
       {c32(registers)})
      ->addFnAttr(llvm::Attribute::Convergent);
}

void KernelBuilder::named_barrier(int id, int threads) {
  ptx(ir_.getVoidTy(), "bar.sync $0, $1;", "r,r,~{memory}", {c32(id), c32(threads)});
}

void KernelBuilder::wgmma_fence() { ptx(ir_.getVoidTy(), "wgmma.fence.sync.aligned;", "~{memory}", {}); }

void KernelBuilder::wgmma_commit() { ptx(ir_.getVoidTy(), "wgmma.commit_group.sync.aligned;", "~{memory}", {}); }

namespace {

// "{$first, ..., $last}"
std::string register_list(int first, int count) {
  std::string out = "{";
  for (int i = 0; i < count; ++i) out += (i ? ", $" : "$") + std::to_string(first + i);
  return out + "}";
}

// count outputs "=f" then, for tying, count inputs "0".."count-1".
std::string tied_constraints(int count, const std::string& middle) {
  std::string out;
  for (int i = 0; i < count; ++i) out += (i ? ",=f" : "=f");
  if (!middle.empty()) out += "," + middle;
  for (int i = 0; i < count; ++i) out += "," + std::to_string(i);
  return out;
}

// wgmma.mma_async m64nNk16 with f32 accumulators $0..$count-1 (tied), then `operands` (A: a
// descriptor or four registers, and B's descriptor) and scale-d's register; `immediates` ends
// the instruction (imm-scale-a, imm-scale-b and the transposes).
std::string wgmma_text(bool bf16, int n, const std::string& operands, int scale_d, const std::string& immediates) {
  const int count = n / 2;
  const char* type = bf16 ? "bf16" : "f16";
  // scale-d is a predicate operand: set from a register (1: D = A·B + D).
  return "{\n\t.reg .pred scale_d;\n\tsetp.ne.b32 scale_d, $" + std::to_string(scale_d) +
         ", 0;\n\twgmma.mma_async.sync.aligned.m64n" + std::to_string(n) + "k16.f32." + type + "." + type + " " +
         register_list(0, count) + ", " + operands + ", scale_d, " + immediates + ";\n\t}";
}

}  // namespace

std::vector<Value*> KernelBuilder::wgmma_m64k16(bool bf16, int n, Value* desc_a, Value* desc_b,
                                                const std::vector<Value*>& acc, bool trans_a, bool trans_b) {
  const int count = n / 2;
  if (static_cast<int>(acc.size()) != count) throw InternalError("wgmma_m64k16: accumulator count");
  const std::string text = wgmma_text(bf16, n, "$" + std::to_string(count) + ", $" + std::to_string(count + 1),
                                      count + 2, std::string("1, 1, ") + (trans_a ? "1" : "0") + ", " + (trans_b ? "1" : "0"));
  std::vector<llvm::Type*> fields(count, f32());
  std::vector<Value*> args{desc_a, desc_b, c32(1)};
  args.insert(args.end(), acc.begin(), acc.end());
  llvm::CallInst* r = ptx(llvm::StructType::get(ctx(), fields), text, tied_constraints(count, "l,l,r"), args);
  std::vector<Value*> out(count);
  for (int i = 0; i < count; ++i) out[i] = ir_.CreateExtractValue(r, i);
  return out;
}

std::vector<Value*> KernelBuilder::wgmma_m64k16_rs(bool bf16, int n, const std::array<Value*, 4>& a, Value* desc_b,
                                                   const std::vector<Value*>& acc, bool trans_b) {
  const int count = n / 2;
  if (static_cast<int>(acc.size()) != count) throw InternalError("wgmma_m64k16_rs: accumulator count");
  const std::string text = wgmma_text(bf16, n, register_list(count, 4) + ", $" + std::to_string(count + 4), count + 5,
                                      std::string("1, 1, ") + (trans_b ? "1" : "0"));
  std::vector<llvm::Type*> fields(count, f32());
  std::vector<Value*> args(a.begin(), a.end());
  args.push_back(desc_b);
  args.push_back(c32(1));
  args.insert(args.end(), acc.begin(), acc.end());
  llvm::CallInst* r = ptx(llvm::StructType::get(ctx(), fields), text, tied_constraints(count, "r,r,r,r,l,r"), args);
  std::vector<Value*> out(count);
  for (int i = 0; i < count; ++i) out[i] = ir_.CreateExtractValue(r, i);
  return out;
}

std::vector<Value*> KernelBuilder::wgmma_wait(int pending, const std::vector<Value*>& acc) {
  const int count = static_cast<int>(acc.size());
  std::vector<llvm::Type*> fields(count, f32());
  llvm::CallInst* r = ptx(llvm::StructType::get(ctx(), fields),
                          "// the accumulators are tied through this wait\n\twgmma.wait_group.sync.aligned " +
                              std::to_string(pending) + ";",
                          tied_constraints(count, ""), acc);
  std::vector<Value*> out(count);
  for (int i = 0; i < count; ++i) out[i] = ir_.CreateExtractValue(r, i);
  return out;
}

std::array<Value*, 4> KernelBuilder::ldmatrix_x4(Value* smem_ptr, bool transpose) {
  auto id = transpose ? llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_trans_b16
                      : llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_b16;
  // .sync.aligned: every lane of the warp must execute it together.
  llvm::CallInst* r = call(id, {smem_ptr}, {smem_ptr->getType()});
  r->addFnAttr(llvm::Attribute::Convergent);
  return {ir_.CreateExtractValue(r, 0), ir_.CreateExtractValue(r, 1), ir_.CreateExtractValue(r, 2),
          ir_.CreateExtractValue(r, 3)};
}

std::array<Value*, 4> KernelBuilder::mma_16816(bool bf16, const std::array<Value*, 4>& a,
                                               const std::array<Value*, 2>& b,
                                               const std::array<Value*, 4>& c) {
  std::vector<Value*> args;
  auto* half2 = llvm::FixedVectorType::get(ir_.getHalfTy(), 2);
  auto operand = [&](Value* v) { return bf16 ? v : ir_.CreateBitCast(v, half2); };
  for (Value* v : a) args.push_back(operand(v));
  for (Value* v : b) args.push_back(operand(v));
  for (Value* v : c) args.push_back(v);
  auto id = bf16 ? llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16
                 : llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_f32_f32;
  llvm::CallInst* r = call(id, args);
  r->addFnAttr(llvm::Attribute::Convergent);
  return {ir_.CreateExtractValue(r, 0), ir_.CreateExtractValue(r, 1), ir_.CreateExtractValue(r, 2),
          ir_.CreateExtractValue(r, 3)};
}

}  // namespace lfce
