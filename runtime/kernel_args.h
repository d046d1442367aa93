// Kernel arguments bound by name to the parameters a kernel declares (its template's signature,
// compiler/kernel_signature.h, kept with the kernel in the disk cache), checked on the host
// before any launch.
//
// The rule. A launch offers values in two ways:
//  - OfferedArgs: the named buffers and sizes of a schedule (or of one chunk of it, over the
//    schedule's: OfferedArgs chunk(&schedule)), which any kernel of it may take. A kernel takes the ones it declares and
//    ignores the rest, so the launch code never restates which options add which parameters:
//    the template decides.
//  - KernelArgs: one launch's pack, over the values offered; a value set on it is meant for
//    this kernel, and one the kernel does not declare is an error (a misspelt name, or a value
//    the template no longer takes).
// Binding takes, for each declared parameter in order, the value of that name nearest to the
// launch (the pack's own, then the offered ones, innermost first). InternalError, naming the
// kernel and the parameter: a declared parameter with no value; a value of another type than
// declared; a value of the launch's own that the kernel does not declare; a name set twice in
// one scope.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/kernel_signature.h"

namespace lfce::runtime {

// Named values of the kernel parameter types (OfferedArgs and KernelArgs set them alike).
class ArgScope {
 public:
  // A pointer (ParamType::GlobalPtr), of any pointee type.
  template <typename T>
  void set(const std::string& name, T* pointer) { put(name, ParamType::GlobalPtr, &pointer, sizeof(void*)); }
  void set(const std::string& name, std::nullptr_t) { set(name, static_cast<const void*>(nullptr)); }
  void set(const std::string& name, int64_t value) { put(name, ParamType::I64, &value, sizeof value); }
  void set(const std::string& name, int32_t value) { put(name, ParamType::I32, &value, sizeof value); }
  void set(const std::string& name, float value) { put(name, ParamType::F32, &value, sizeof value); }
  void set(const std::string& name, const CUtensorMap& map);
  // Any other type (unsigned, size_t, double, bool) is no kernel parameter's: convert explicitly.
  template <typename T>
  void set(const std::string& name, T value) = delete;

 protected:
  explicit ArgScope(const ArgScope* outer) : outer_(outer) {}
  ArgScope(const ArgScope&) = default;
  ArgScope& operator=(const ArgScope&) = default;
  ~ArgScope() = default;

  struct Value {
    std::string name;
    ParamType type;
    std::array<unsigned char, 8> bytes{};  // a scalar or a pointer
    int map = -1;                          // a tensor map: its index in maps_
  };
  // The value named `name` nearest to this scope and the scope that holds it, or nulls.
  struct Found {
    const ArgScope* scope = nullptr;
    const Value* value = nullptr;
  };
  Found find(std::string_view name) const;
  // The address of the bytes of `value`, one of `scope`'s, as the driver reads a kernel argument.
  static void* address(const ArgScope& scope, const Value& value);

  std::vector<Value> values_;

 private:
  void put(const std::string& name, ParamType type, const void* bytes, std::size_t size);

  const ArgScope* outer_;
  std::vector<CUtensorMap> maps_;
};

// Values offered to every kernel of a schedule (or of a chunk: over the schedule's).
class OfferedArgs : public ArgScope {
 public:
  OfferedArgs() : ArgScope(nullptr) {}
  // Over `outer`'s values, which must outlive it: a value set here hides outer's of that name.
  explicit OfferedArgs(const OfferedArgs* outer) : ArgScope(outer) {}
  OfferedArgs(const OfferedArgs&) = delete;
  OfferedArgs& operator=(const OfferedArgs&) = delete;
};

// One launch's arguments: its own values over those offered.
class KernelArgs : public ArgScope {
 public:
  KernelArgs() : ArgScope(nullptr) {}
  // (Implicit: a launch that adds nothing passes the offered values as they are.)
  KernelArgs(const OfferedArgs& offered) : ArgScope(&offered) {}  // NOLINT(google-explicit-constructor)
  KernelArgs(const KernelArgs&) = default;

  // The kernel argument pointers, in the order of `params` (cuLaunchKernel's kernelParams),
  // valid while this pack and the values it is over live unchanged. Throws InternalError as the
  // rule above says; `kernel` names the kernel in the message.
  std::vector<void*> bind(const std::string& kernel, const KernelSignature& params) const;
};

}  // namespace lfce::runtime
