// The layout of every public struct of lfce.h as this library was compiled (api/struct_layout.def):
// what lfce_struct_size and lfce_struct_layout report, and what bindings check their mirrors by.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace lfce::api {

struct FieldLayout {
  const char* name;
  size_t offset, size;
};

struct StructLayout {
  const char* name;
  size_t size;
  std::vector<FieldLayout> fields;  // in declaration order
};

// The struct of lfce.h named `name`; nullptr if there is none.
const StructLayout* struct_layout(std::string_view name);

}  // namespace lfce::api
