#include "runtime/kernel_args.h"

#include <cstring>

#include "compiler/errors.h"

namespace lfce::runtime {

void ArgScope::set(const std::string& name, const CUtensorMap& map) {
  put(name, ParamType::TensorMap, nullptr, 0);
  values_.back().map = static_cast<int>(maps_.size());
  maps_.push_back(map);
}

void ArgScope::put(const std::string& name, ParamType type, const void* bytes, std::size_t size) {
  for (const Value& v : values_)
    if (v.name == name) throw InternalError("kernel arguments: '" + name + "' is set twice");
  Value value{name, type};
  if (size) std::memcpy(value.bytes.data(), bytes, size);
  values_.push_back(std::move(value));
}

ArgScope::Found ArgScope::find(std::string_view name) const {
  for (const ArgScope* scope = this; scope; scope = scope->outer_)
    for (const Value& v : scope->values_)
      if (v.name == name) return {scope, &v};
  return {};
}

void* ArgScope::address(const ArgScope& scope, const Value& value) {
  if (value.map >= 0) return const_cast<CUtensorMap*>(&scope.maps_[static_cast<std::size_t>(value.map)]);
  return const_cast<unsigned char*>(value.bytes.data());
}

std::vector<void*> KernelArgs::bind(const std::string& kernel, const KernelSignature& params) const {
  for (const Value& own : values_) {
    bool declared = false;
    for (const KernelParam& p : params) declared = declared || p.name == own.name;
    if (!declared)
      throw InternalError("kernel " + kernel + ": the launch passes '" + own.name + "', which the kernel does not declare");
  }
  std::vector<void*> pointers;
  pointers.reserve(params.size());
  for (const KernelParam& p : params) {
    const auto [scope, value] = find(p.name);
    if (!value)
      throw InternalError("kernel " + kernel + ": no value for its parameter '" + p.name + "' (" +
                          param_type_name(p.type) + ")");
    if (value->type != p.type)
      throw InternalError("kernel " + kernel + ": its parameter '" + p.name + "' is " + param_type_name(p.type) +
                          ", the launch passes " + param_type_name(value->type));
    pointers.push_back(address(*scope, *value));
  }
  return pointers;
}

}  // namespace lfce::runtime
