// The C API's argument structs as the runtime takes them (runtime/launch.h): the only place
// lfce_forward_args and lfce_backward_args meet the runtime. Each field is copied by name, the list
// of fields coming from api/struct_layout.def (the table the struct layouts are exported from), so
// a field added to the C struct and the table but not to the runtime's struct fails to compile here
// instead of arriving as null.
#pragma once

#include <type_traits>

#include "lfce/lfce.h"
#include "runtime/launch.h"

namespace lfce::api {

// Every field of the C struct `C` (its rows of struct_layout.def) copied into the runtime's `R`.
template <typename C, typename R>
R args_from_c(const C& c) {
  R a;
#define LFCE_STRUCT(s)
#define LFCE_FIELD(s, f)                       \
  if constexpr (std::is_same_v<C, s>) a.f = c.f;
#include "api/struct_layout.def"
#undef LFCE_STRUCT
#undef LFCE_FIELD
  return a;
}

inline runtime::ForwardArgs forward_args_from_c(const lfce_forward_args& c) {
  return args_from_c<lfce_forward_args, runtime::ForwardArgs>(c);
}

inline runtime::BackwardArgs backward_args_from_c(const lfce_backward_args& c) {
  return args_from_c<lfce_backward_args, runtime::BackwardArgs>(c);
}

}  // namespace lfce::api
