#include "compiler/nvptx_backend.h"

#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <atomic>
#include <map>
#include <mutex>

#include "compiler/errors.h"

namespace lfce {
namespace {

constexpr const char* kTriple = "nvptx64-nvidia-cuda";
std::atomic<int64_t> g_emitted{0};

void init_llvm_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    // 32-bit shared/local pointers, as Triton uses: cheaper address arithmetic. LLVM
    // options are process-global, so this is set once, before any TargetMachine exists.
    const char* argv[] = {"lfce", "-nvptx-short-ptr"};
    llvm::cl::ParseCommandLineOptions(2, argv, "lfce\n");
  });
}

// One TargetMachine per arch per compiling thread: TargetMachines are not thread-safe.
llvm::TargetMachine& target_machine(Arch arch) {
  init_llvm_once();
  thread_local std::map<Arch, std::unique_ptr<llvm::TargetMachine>> machines;
  auto& tm = machines[arch];
  if (!tm) {
    std::string error;
    const llvm::Target* target = llvm::TargetRegistry::lookupTarget(kTriple, error);
    if (!target) throw CompileError("LLVM has no NVPTX target: " + error);
    llvm::TargetOptions options;
    options.AllowFPOpFusion = llvm::FPOpFusion::Fast;  // FMA contraction, as nvcc does by default
    const ArchInfo& info = arch_info(arch);
    tm.reset(target->createTargetMachine(kTriple, info.llvm_cpu, info.llvm_features, options,
                                         std::nullopt, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
    if (!tm) throw CompileError(std::string("LLVM could not create a target machine for ") + info.name);
  }
  return *tm;
}

void verify(llvm::Module& module, const char* stage) {
  std::string log;
  llvm::raw_string_ostream out(log);
  if (llvm::verifyModule(module, &out))
    throw CompileError(std::string("LLVM IR of ") + module.getName().str() + " fails verification " +
                       stage + ":\n" + out.str());
}

}  // namespace

std::unique_ptr<llvm::Module> new_module(llvm::LLVMContext& ctx, const std::string& name, Arch arch) {
  auto module = std::make_unique<llvm::Module>(name, ctx);
  module->setTargetTriple(kTriple);
  module->setDataLayout(target_machine(arch).createDataLayout());
  return module;
}

std::string emit_ptx(llvm::Module& module, Arch arch) {
  llvm::TargetMachine& tm = target_machine(arch);
  verify(module, "before optimisation");

  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(&tm);  // registers NVVMReflect and the NVPTX IR passes
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(module, mam);
  verify(module, "after optimisation");

  llvm::SmallString<0> ptx;
  llvm::raw_svector_ostream out(ptx);
  llvm::legacy::PassManager codegen;  // LLVM 19 codegen still runs on the legacy pass manager
  if (tm.addPassesToEmitFile(codegen, out, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw CompileError("the NVPTX target cannot emit PTX");
  codegen.run(module);
  ++g_emitted;
  return std::string(ptx.str());
}

int64_t emitted_module_count() { return g_emitted.load(); }

}  // namespace lfce
