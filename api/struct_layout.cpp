#include "api/struct_layout.h"

#include <cstddef>

#include "lfce/lfce.h"

namespace lfce::api {
namespace {

std::vector<StructLayout> layouts() {
  std::vector<StructLayout> out;
#define LFCE_STRUCT(s) out.push_back(StructLayout{#s, sizeof(s), {}});
#define LFCE_FIELD(s, f) out.back().fields.push_back(FieldLayout{#f, offsetof(s, f), sizeof(s::f)});
#include "api/struct_layout.def"
#undef LFCE_STRUCT
#undef LFCE_FIELD
  return out;
}

}  // namespace

const StructLayout* struct_layout(std::string_view name) {
  static const std::vector<StructLayout> all = layouts();
  for (const StructLayout& s : all)
    if (name == s.name) return &s;
  return nullptr;
}

}  // namespace lfce::api
