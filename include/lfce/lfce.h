/* lfce — fused linear + cross-entropy kernels generated at run time.
 *
 * The one public header of liblfce.so. Every function returns an lfce_status; on
 * failure lfce_last_error() gives a message (per calling thread) that names the
 * offending value. Nothing here synchronises the host with the device: forward and
 * backward only enqueue work on the caller's stream.
 *
 * Memory is the caller's: the library allocates no device memory. The caller asks
 * for the workspace size, allocates it (e.g. from PyTorch's caching allocator) and
 * passes it in.
 */
#ifndef LFCE_LFCE_H
#define LFCE_LFCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LFCE_API __attribute__((visibility("default")))

typedef enum lfce_status {
  LFCE_OK = 0,
  LFCE_ERR_INVALID_ARGUMENT = 1, /* the caller's request is wrong: see lfce_last_error() */
  LFCE_ERR_COMPILE = 2,          /* LLVM or the driver's PTX JIT failed; the log is in the message */
  LFCE_ERR_CUDA = 3,             /* a driver call failed, or no driver/GPU is present */
  LFCE_ERR_INTERNAL = 4          /* a bug in lfce */
} lfce_status;

typedef enum lfce_dtype { LFCE_DTYPE_BF16 = 0, LFCE_DTYPE_FP16 = 1, LFCE_DTYPE_FP32 = 2 } lfce_dtype;
typedef enum lfce_index_dtype { LFCE_INDEX_INT64 = 0, LFCE_INDEX_INT32 = 1 } lfce_index_dtype;
typedef enum lfce_reduction {
  LFCE_REDUCTION_MEAN = 0,
  LFCE_REDUCTION_SUM = 1,
  LFCE_REDUCTION_NONE = 2
} lfce_reduction;
typedef enum lfce_mode { LFCE_MODE_RECOMPUTE = 0, LFCE_MODE_EAGER = 1 } lfce_mode;

/* One fused linear + cross-entropy problem. hidden [tokens, hidden] and weight
 * [vocab, hidden] are row-major and contiguous, 16-byte aligned, in `dtype`;
 * bias [vocab] in `dtype`; targets [tokens] in `target_dtype`. */
typedef struct lfce_problem {
  int64_t tokens;           /* N >= 1; a run-time value, not part of any kernel's specialisation */
  int64_t hidden;           /* H >= 1, a multiple of 8 (16-bit dtypes) or 4 (fp32) */
  int64_t vocab;            /* V >= 1 */
  int32_t dtype;            /* lfce_dtype of hidden, weight, bias and the gradients */
  int32_t target_dtype;     /* lfce_index_dtype */
  int32_t has_bias;         /* 0 or 1 */
  int32_t reduction;        /* lfce_reduction */
  int32_t mode;             /* lfce_mode */
  int32_t reserved;         /* must be 0 */
  int64_t ignore_index;     /* targets equal to this contribute no loss and no gradient */
  int64_t chunk_size;       /* vocabulary chunk of the backward; 0 = derive from workspace_budget */
  int64_t workspace_budget; /* bytes for the backward's logit-gradient chunk; 0 = 256 MiB */
} lfce_problem;

typedef struct lfce_forward_args {
  const void* hidden;
  const void* weight;
  const void* bias;      /* NULL unless has_bias */
  const void* targets;
  float* lse;            /* [tokens] out: log-sum-exp of each row (saved for the backward) */
  float* token_loss;     /* [tokens] out: per-token loss, 0 for ignored tokens */
  float* loss;           /* [1] out: the reduced loss (mean or sum); may be NULL for reduction none */
  float* valid_count;    /* [1] out: number of targets != ignore_index */
  void* workspace;       /* lfce_forward_workspace_size() bytes, 256-byte aligned */
  size_t workspace_bytes;
  int32_t device;        /* CUDA device ordinal */
  void* stream;          /* CUstream to enqueue on (NULL = legacy default stream) */
} lfce_forward_args;

typedef struct lfce_backward_args {
  const void* hidden;
  const void* weight;
  const void* bias;      /* NULL unless has_bias */
  const void* targets;
  const float* lse;          /* from lfce_forward */
  const float* valid_count;  /* from lfce_forward */
  const float* grad_loss;    /* fp32: [1] for mean/sum, [tokens] for none; NULL means 1 */
  void* grad_hidden;         /* [tokens, hidden] out, in dtype */
  void* grad_weight;         /* [vocab, hidden] out, in dtype */
  void* grad_bias;           /* [vocab] out, in dtype; NULL unless has_bias */
  void* workspace;           /* lfce_backward_workspace_size() bytes, 256-byte aligned */
  size_t workspace_bytes;
  int32_t device;
  void* stream;
} lfce_backward_args;

/* One generated kernel, handed to an lfce_generate() callback. Pointers are valid
 * only during the callback. */
typedef struct lfce_kernel_info {
  const char* name;      /* template name, e.g. "lse_forward" */
  const char* spec;      /* canonical KernelSpec text */
  const char* ptx;       /* NUL-terminated PTX */
  size_t ptx_size;
  double compile_ms;     /* LLVM time (IR build + O3 + PTX emission) */
  uint32_t smem_bytes;   /* dynamic shared memory per CTA */
  uint32_t threads;      /* threads per CTA */
} lfce_kernel_info;

typedef void (*lfce_kernel_callback)(const lfce_kernel_info* kernel, void* user);

LFCE_API const char* lfce_version(void);
/* Message of the last failed call on this thread ("" if none). */
LFCE_API const char* lfce_last_error(void);
/* "trace", "debug", "info", "warn", "error", "off". Default from LFCE_LOG_LEVEL, else "warn". */
LFCE_API int lfce_set_log_level(const char* level);

LFCE_API int lfce_check_problem(const lfce_problem* problem);
LFCE_API int lfce_forward_workspace_size(const lfce_problem* problem, size_t* bytes);
LFCE_API int lfce_backward_workspace_size(const lfce_problem* problem, size_t* bytes);
/* Vocabulary chunk width the backward will use for this problem. */
LFCE_API int lfce_backward_chunk_size(const lfce_problem* problem, int64_t* chunk);

LFCE_API int lfce_forward(const lfce_problem* problem, const lfce_forward_args* args);
LFCE_API int lfce_backward(const lfce_problem* problem, const lfce_backward_args* args);

/* Generates every kernel the problem needs for `arch` ("sm_80" or "sm_90a") without
 * touching a GPU, and hands each to `callback`. */
LFCE_API int lfce_generate(const lfce_problem* problem, const char* arch, lfce_kernel_callback callback,
                           void* user);

/* Model presets: comma-separated names, and one preset's output-layer shape. */
LFCE_API const char* lfce_preset_names(void);
LFCE_API int lfce_preset(const char* name, int64_t* hidden, int64_t* vocab);

/* Number of kernels compiled by LLVM in this process (a hook for cache tests). */
LFCE_API int64_t lfce_compile_count(void);

#ifdef __cplusplus
}
#endif
#endif /* LFCE_LFCE_H */
