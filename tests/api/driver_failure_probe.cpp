// One process of the driver-failure tests (driver_failure_test.cpp): drives the C API of
// liblfce.so, as users do, against the libcuda that LFCE_LIBCUDA names (the fake), and prints
// what it returned. A fresh process per case: lfce loads the driver once per process.
//
//   driver_failure_probe run    lfce_forward then lfce_backward of a small fp32 problem
//   driver_failure_probe tune   lfce_tune of the same problem (small space, one repetition)
//
// Output: "status=<code>", "message=<lfce_last_error()>" and, for tune, one "result ..." line
// per kernel kind. Device pointers are bare addresses: the fake never dereferences them.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "lfce/lfce.h"

namespace {

lfce_problem problem() {
  lfce_problem p{};
  p.tokens = 16;
  p.hidden = 64;
  p.vocab = 256;
  p.dtype = LFCE_DTYPE_FP32;  // the cheapest kernels to generate
  p.target_dtype = LFCE_INDEX_INT64;
  p.reduction = LFCE_REDUCTION_MEAN;
  p.mode = LFCE_MODE_RECOMPUTE;
  p.ignore_index = -100;
  return p;
}

void* address(uint64_t a) { return reinterpret_cast<void*>(a << 24); }  // 16 MiB apart, aligned

int run() {
  const lfce_problem p = problem();
  size_t forward_bytes = 0, backward_bytes = 0;
  if (int s = lfce_forward_workspace_size(&p, &forward_bytes)) return s;
  if (int s = lfce_backward_workspace_size(&p, &backward_bytes)) return s;
  lfce_forward_args f{};
  f.hidden = address(1);
  f.weight = address(2);
  f.targets = address(3);
  f.lse = static_cast<float*>(address(4));
  f.token_loss = static_cast<float*>(address(5));
  f.loss = static_cast<float*>(address(6));
  f.valid_count = static_cast<float*>(address(7));
  f.workspace = address(8);
  f.workspace_bytes = forward_bytes;
  if (int s = lfce_forward(&p, &f)) return s;
  lfce_backward_args b{};
  b.hidden = f.hidden;
  b.weight = f.weight;
  b.targets = f.targets;
  b.lse = f.lse;
  b.valid_count = f.valid_count;
  b.grad_loss = static_cast<const float*>(address(12));
  b.grad_hidden = address(9);
  b.grad_weight = address(10);
  b.workspace = address(11);
  b.workspace_bytes = backward_bytes;
  return lfce_backward(&p, &b);
}

void print_result(const lfce_tune_result* r, void*) {
  std::printf("result kernel=%s measured=%d failed=%d winner=%s path=%s\n", r->kernel, r->measured, r->failed,
              r->winner ? r->winner : "none", r->path);
}

int tune() {
  const lfce_problem p = problem();
  lfce_tune_options o{};
  o.space = "small";
  o.repetitions = 1;
  int32_t stopped = 0;
  return lfce_tune(&p, &o, print_result, nullptr, &stopped);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "run") != 0 && std::strcmp(argv[1], "tune") != 0)) {
    std::fprintf(stderr, "usage: %s run|tune\n", argv[0]);
    return 2;
  }
  const int status = std::strcmp(argv[1], "run") == 0 ? run() : tune();
  std::printf("status=%d\nmessage=%s\n", status, status ? lfce_last_error() : "");
  return 0;
}
