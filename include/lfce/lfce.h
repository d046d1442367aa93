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

/* Version of the binary interface: the layout of every struct and the signature of every
 * function in this header. Bump it whenever one of them changes; a binding compares its own
 * copy with lfce_abi_version() when it loads the library, so a stale library is an error at
 * load time instead of corrupted arguments. */
#define LFCE_ABI_VERSION 11

typedef enum lfce_status {
  LFCE_OK = 0,
  LFCE_ERR_INVALID_ARGUMENT = 1, /* the caller's request is wrong: see lfce_last_error() */
  LFCE_ERR_COMPILE = 2,          /* LLVM or the driver's PTX JIT failed; the log is in the message */
  LFCE_ERR_CUDA = 3,             /* a driver call failed, or no driver/GPU is present */
  LFCE_ERR_INTERNAL = 4,         /* a bug in lfce */
  LFCE_ERR_IO = 5,               /* the cache's files: a folder that is a symbolic link, files that could not
                                    be removed; the message names each path */
  LFCE_ERR_OUT_OF_RESOURCES = 6  /* the problem or a kernel of it needs more of a device resource than the
                                    device has: lfce_last_resource_error() gives which, and the numbers */
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
 * [vocab, hidden] are row-major and contiguous (row stride `hidden` elements, no padding),
 * in `dtype`, each starting on 16 bytes when hidden * element bytes is a multiple of 16,
 * else on the largest of 8, 4 or the element size that divides it (a contiguous tensor
 * from PyTorch's allocator always is); bias [vocab] in `dtype`; targets [tokens] in
 * `target_dtype`. Sizes beyond the limits below are rejected (LFCE_ERR_INVALID_ARGUMENT
 * naming the value). */
/* lfce_problem.outputs: per-token values computed in the forward's passes, none of them N x V.
 * ENTROPY: -sum_v p_v log p_v of the softmax (every token, ignored ones too); LOGPROB: log p_y of
 * the target (0 for ignored tokens, NaN for a target outside [0, V)); both differentiable through
 * lfce_backward_args.grad_lse. PREDICTED: argmax_v of the logits the softmax sees (the lowest
 * index among equal maxima; -1 for ignored tokens). "The softmax" is that of the logits after
 * softcap and temperature, with no label smoothing, class weight or token scaling. */
typedef enum lfce_output { LFCE_OUTPUT_ENTROPY = 1, LFCE_OUTPUT_LOGPROB = 2, LFCE_OUTPUT_PREDICTED = 4 } lfce_output;

typedef struct lfce_problem {
  int64_t tokens;           /* 1 <= N <= 2^31 - 1; a run-time value, not part of any kernel's specialisation */
  int64_t hidden;           /* 1 <= H <= 2^20, any value (H not a multiple of 8 in 16-bit, of 4
                               in fp32: narrower copies, no TMA on sm_90a; slower) */
  int64_t vocab;            /* 1 <= V <= 2^31 - 1 */
  int32_t dtype;            /* lfce_dtype of hidden, weight, bias and the gradients */
  int32_t target_dtype;     /* lfce_index_dtype */
  int32_t has_bias;         /* 0 or 1 */
  int32_t reduction;        /* lfce_reduction */
  int32_t mode;             /* lfce_mode */
  float softcap;            /* logit softcap c (Gemma 2: 30): the softmax sees c * tanh(z / c) of each
                               logit z (bias included), with the chain rule in the backward; 0 = none */
  float temperature;        /* T in [1e-6, 1e6]: the softmax sees each logit (capped first, with a softcap)
                               divided by T, and the loss is LSE(z / T) - z_y / T; 0 or 1 = none */
  float z_loss_scale;       /* s in [0, 1e6]: each counted token's loss gains s * LSE^2 (PaLM's z-loss;
                               LSE of the logits the softmax sees), with its gradient; 0 = none */
  float label_smoothing;    /* eps in [0, 1] (PyTorch's cross_entropy semantics): each counted token's
                               cross-entropy term becomes (1 - eps) * (LSE - z_y) + eps / V * sum_v (LSE - z_v),
                               with class weights (1 - eps) * w_y * (LSE - z_y) + eps / V * sum_v w_v * (LSE - z_v);
                               0 = none */
  int32_t has_class_weight; /* 0 or 1: per-class weights w [vocab] (PyTorch's cross_entropy `weight`) scale
                               each counted token's cross-entropy term by w_y; "mean" divides the
                               cross-entropy and smoothing terms by the sum of w_y over counted tokens and the
                               z-loss by their count. Not with fp16. */
  int32_t accumulate_grad_weight; /* 0 or 1: lfce_backward_args.grad_weight is an fp32 [vocab, hidden]
                               buffer (e.g. Megatron's main_grad) to which the backward adds grad_weight in
                               place, in any dtype: no [V, H] temporary. Recompute mode only (eager mode
                               computes the gradients before the upstream gradient is known). */
  int32_t accumulate_grad_bias; /* 0 or 1: likewise grad_bias, an fp32 [vocab] buffer (needs has_bias) */
  int32_t token_scaling;    /* 0 or 1 (Liger-Kernel's use_token_scaling): each counted token's loss (z-loss
                               included) and gradient times its detached p(target) = exp(z_y - LSE) of the
                               logits the softmax sees; lse is then [2 * tokens] (see lfce_forward_args) */
  int32_t outputs;          /* extra per-token outputs of the forward, a sum of lfce_output flags (0 = none):
                               entropy and logprob add rows to lse, predicted fills lfce_forward_args.predicted */
  int64_t ignore_index;     /* targets equal to this contribute no loss and no gradient */
  int64_t chunk_size;       /* vocabulary chunk of the backward, <= 2^20 (larger than V: V);
                               0 = derive from workspace_budget (also at most 2^20). In eager mode's
                               three-GEMM schedule (lfce_forward_backward): tokens per chunk instead */
  int64_t workspace_budget; /* bytes for the backward's logit-gradient chunk; 0 = 256 MiB. In eager
                               mode's three-GEMM schedule: bytes for one token chunk's [chunk, vocab]
                               exponentials in dtype (0 = every token in one chunk) */
  int64_t sequence_length;  /* T >= 1 with a causal shift (Cut Cross-Entropy's shift): the tokens are
                               sequences of T positions (tokens a multiple of T) and position t of each
                               is scored against targets[t + 1] of the same sequence, read in place (no
                               shifted copy); its last position counts as ignored (no loss, no
                               gradient, not in valid_count). The targets array is the unshifted
                               [tokens] one. 0 = no shift */
} lfce_problem;

typedef struct lfce_forward_args {
  const void* hidden;
  const void* weight;
  const void* bias;      /* NULL unless has_bias */
  const void* targets;
  const float* class_weight; /* [vocab] fp32, finite, >= 0; NULL unless has_class_weight */
  float* lse;            /* [rows * tokens] out, saved for the backward: row 0 the log-sum-exp of each
                            token's logits as the softmax sees them (after softcap and temperature); then,
                            each where asked for, a row of each token's scale p(target) with token_scaling
                            (0 for ignored tokens), of its entropy (LFCE_OUTPUT_ENTROPY) and of its logprob
                            (LFCE_OUTPUT_LOGPROB), in that order: rows = 1 + token_scaling + one per output */
  float* token_loss;     /* [tokens] out: per-token loss (weighted, smoothed, z-loss included), 0 for
                            ignored tokens */
  float* loss;           /* [1] out: the reduced loss (mean or sum); may be NULL for reduction none */
  float* valid_count;    /* [1] out: number of targets != ignore_index (the counted tokens); with
                            has_class_weight [3]: then the sum of the counted tokens' class weights
                            w_y ("mean"'s denominator of the cross-entropy and smoothing terms) and
                            the sum of all V class weights (written with label_smoothing only) */
  int64_t* predicted;    /* [tokens] out with LFCE_OUTPUT_PREDICTED (argmax ids, -1 for ignored tokens);
                            else NULL */
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
  const float* class_weight; /* [vocab] fp32 as given to lfce_forward; NULL unless has_class_weight */
  const float* lse;          /* from lfce_forward ([rows * tokens], see lfce_forward_args) */
  const float* valid_count;  /* from lfce_forward ([1], or [3] with has_class_weight) */
  const float* grad_loss;    /* fp32: [1] for mean/sum, [tokens] for none; NULL means 1 */
  const float* grad_lse;     /* fp32 [rows * tokens] like lse, or NULL (none): the upstream gradients of
                                the LSE, entropy and logprob rows, added to the loss's (the token-scale
                                row is not read: the scale is detached). Not with fp16. */
  /* The gradients: each may be NULL when the caller does not need it (a frozen LM head, a frozen
   * input, LoRA); the kernel that would compute it is then neither compiled nor launched. */
  void* grad_hidden;         /* [tokens, hidden] out, in dtype (aligned to its elements); or NULL */
  void* grad_weight;         /* [vocab, hidden] out, in dtype (with accumulate_grad_weight: fp32, added to); or NULL */
  void* grad_bias;           /* [vocab] out, in dtype (with accumulate_grad_bias: fp32, added to); or NULL
                                (always unused without has_bias) */
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
/* LFCE_ABI_VERSION of the header the library was built from. */
LFCE_API int lfce_abi_version(void);
/* sizeof the struct named `name` ("lfce_problem", "lfce_forward_args", ...: every struct in this
 * header) as the library was compiled; an unknown name is LFCE_ERR_INVALID_ARGUMENT. */
LFCE_API int lfce_struct_size(const char* name, size_t* bytes);
/* Calls `callback` once per field of the struct named `name`, in declaration order, with the field's
 * name, its byte offset and its size as the library was compiled, so that a binding can check its
 * mirror field by field (two swapped fields of one size keep the struct's size). An unknown name is
 * LFCE_ERR_INVALID_ARGUMENT. Added without an ABI version change: a library without it predates it. */
typedef void (*lfce_field_callback)(const char* field, size_t offset, size_t size, void* user);
LFCE_API int lfce_struct_layout(const char* name, lfce_field_callback callback, void* user);
/* Message of the last failed call on this thread ("" if none). */
LFCE_API const char* lfce_last_error(void);
/* After a call on this thread that returned LFCE_ERR_OUT_OF_RESOURCES: the resource's name
 * ("shared memory per block", "tiles in one launch"; valid until the next lfce call on this thread),
 * the amount the problem requires and the device's limit, in the resource's unit (bytes, tiles).
 * LFCE_ERR_INVALID_ARGUMENT if the last call failed otherwise or did not fail, or an output is NULL. */
LFCE_API int lfce_last_resource_error(const char** resource, int64_t* required, int64_t* limit);
/* "trace", "debug", "info", "warn", "error", "off". Default from LFCE_LOG_LEVEL, else "warn". */
LFCE_API int lfce_set_log_level(const char* level);

LFCE_API int lfce_check_problem(const lfce_problem* problem);
LFCE_API int lfce_forward_workspace_size(const lfce_problem* problem, size_t* bytes);
LFCE_API int lfce_backward_workspace_size(const lfce_problem* problem, size_t* bytes);
/* Vocabulary chunk width the backward will use for this problem. */
LFCE_API int lfce_backward_chunk_size(const lfce_problem* problem, int64_t* chunk);

LFCE_API int lfce_forward(const lfce_problem* problem, const lfce_forward_args* args);
/* Computes the gradients whose pointers are not NULL (see lfce_backward_args). With all of
 * grad_hidden, grad_weight and grad_bias NULL there is nothing to compute: after checking the
 * other arguments it returns LFCE_OK having launched nothing (nor touched the driver). The
 * workspace size does not depend on which gradients are asked for (its fp32 grad_hidden
 * accumulator goes unused without grad_hidden). */
LFCE_API int lfce_backward(const lfce_problem* problem, const lfce_backward_args* args);

/* Eager mode (problem->mode = LFCE_MODE_EAGER; any other mode is LFCE_ERR_INVALID_ARGUMENT): the
 * forward, with every output of lfce_forward in `args`, and the gradients of the loss for an upstream
 * gradient of 1 (of the sum of the per-token losses for reduction none), which the caller scales by
 * the real one in its backward. grad_hidden [tokens, hidden], grad_weight [vocab, hidden] and
 * grad_bias [vocab] are in dtype; each may be NULL (not computed). args->workspace must be
 * lfce_forward_backward_workspace_size() bytes. Most problems run three GEMMs (logits, then
 * dz·W and dzᵀ·x from dz formed once, exactly as recompute mode forms it), one chunk of tokens at a
 * time (chunk_size / workspace_budget, see lfce_problem); a softcap, label smoothing, the entropy
 * or predicted outputs, vocab > 2^20, or token scaling / logprob with several token chunks run the
 * forward and then the recompute backward instead (lfce_eager_schedule tells which). */
LFCE_API int lfce_forward_backward_workspace_size(const lfce_problem* problem, size_t* bytes);
LFCE_API int lfce_forward_backward(const lfce_problem* problem, const lfce_forward_args* args, void* grad_hidden,
                                   void* grad_weight, void* grad_bias);
/* Eager mode's backward: dst[i] = src[i] * scale[0] for count elements of dtype (an lfce_dtype), the fp32
 * product rounded once to dtype (torch.mul of a 16-bit tensor rounds the fp32 scale to its dtype first): the gradients
 * lfce_forward_backward computed for an upstream gradient of 1, times the real one, read on the device
 * (no host synchronisation), on `stream` (a CUstream, NULL = legacy default) of `device`. src and dst
 * start on 16 bytes and may be the same buffer (in place with a scale of 1 nothing is written); scale is
 * one fp32 value in device memory. */
LFCE_API int lfce_scale_gradient(int32_t dtype, const void* src, void* dst, int64_t count, const float* scale,
                                 int32_t device, void* stream);
/* How lfce_forward_backward runs `problem`: *three_gemm = 1 for the three-GEMM schedule, with
 * *token_chunk tokens per chunk (the last may have fewer); *three_gemm = 0 (and *token_chunk = tokens)
 * for the forward and recompute backward. */
LFCE_API int lfce_eager_schedule(const lfce_problem* problem, int32_t* three_gemm, int64_t* token_chunk);

/* Generates every kernel the problem needs for `arch` ("sm_80" or "sm_90a") without
 * touching a GPU, and hands each to `callback`. */
LFCE_API int lfce_generate(const lfce_problem* problem, const char* arch, lfce_kernel_callback callback,
                           void* user);

/* ---- Kernel cache (on disk; see docs/cache.md) ------------------------------------------- */

/* The cache directory in use: $LFCE_CACHE_DIR, else $XDG_CACHE_HOME/lfce, else ~/.cache/lfce. */
LFCE_API const char* lfce_cache_dir(void);
/* Use another cache directory from now on in this process: for the kernels and the tuning winners
 * (<dir>/tuning) alike. */
LFCE_API int lfce_set_cache_dir(const char* dir);
/* Reads the environment again (LFCE_LOG_LEVEL, LFCE_CACHE_DIR unless lfce_set_cache_dir chose one,
 * LFCE_DEVICE_SMEM_LIMIT / LFCE_DEVICE_SM_COUNT for devices not used yet); the first C API call reads
 * it once. Forgets the tunings and plans read so far. LFCE_ERR_INVALID_ARGUMENT names a bad value. */
LFCE_API int lfce_reload_options(void);

typedef struct lfce_precompiled {
  const char* name;     /* template name */
  const char* spec;     /* canonical KernelSpec text */
  const char* key;      /* cache key of the PTX entry */
  int32_t cache_hit;    /* 1: found in the cache, LLVM did not run */
  double compile_ms;    /* LLVM time (recorded in the entry on a hit) */
  double elapsed_ms;    /* this call's time for the kernel */
  size_t ptx_size;
} lfce_precompiled;
typedef void (*lfce_precompile_callback)(const lfce_precompiled* kernel, void* user);

/* Fills the cache with the PTX of every kernel the problem needs on `arch` ("sm_90a", "sm_80"),
 * with the tuned tiles where a tuning is stored (with an entropy or logprob output, also the
 * backward kernel that takes their gradients, lfce_backward_args.grad_lse). No GPU needed. */
LFCE_API int lfce_precompile(const lfce_problem* problem, const char* arch, lfce_precompile_callback callback,
                             void* user);

/* The GPU that precompiled kernels are for, where it differs from the arch's reference device
 * (an H200-class GPU for sm_90a: 132 SMs, 227 KiB of shared memory per block): default tiles
 * and their narrowing depend on both, so kernels precompiled for other limits are not the ones
 * that GPU loads. 0 in a field: the reference value. sm_count in [0, 2^20]; smem_per_block
 * (the opt-in limit per block, in bytes, as cuDeviceGetAttribute reports it) in [0, 2^30]. */
typedef struct lfce_device_limits {
  int32_t sm_count;
  int32_t smem_per_block;
} lfce_device_limits;

/* lfce_precompile for a GPU with these limits (NULL: as lfce_precompile). The tuned tiles
 * looked up are those stored for these limits. */
LFCE_API int lfce_precompile_for(const lfce_problem* problem, const char* arch, const lfce_device_limits* limits,
                                 lfce_precompile_callback callback, void* user);

typedef struct lfce_cache_entry {
  const char* key;
  const char* kind;     /* "ptx" or "cubin" */
  const char* spec;
  const char* arch;
  int64_t bytes;        /* payload size */
  int64_t created_unix;
  int32_t registers;    /* -1 where unknown (PTX entries) */
  int32_t local_bytes;  /* spill bytes; -1 where unknown */
} lfce_cache_entry;
typedef void (*lfce_cache_entry_callback)(const lfce_cache_entry* entry, void* user);
typedef void (*lfce_text_callback)(const char* text, void* user);

LFCE_API int lfce_cache_list(lfce_cache_entry_callback callback, void* user);
/* The metadata (JSON) of the entry whose key is `key` or starts with it. */
LFCE_API int lfce_cache_info(const char* key, lfce_text_callback callback, void* user);
/* Checks every entry; hands each bad one to `callback` as "key: file: problem"; removes them if
 * remove_bad (LFCE_ERR_IO, naming them, if some could not be removed). */
LFCE_API int lfce_cache_verify(int32_t remove_bad, lfce_text_callback callback, void* user, int64_t* checked,
                               int64_t* bad);
/* Removes entries older than older_than_days (finite, >= 0; 0 removes every entry); only files
 * the cache wrote. LFCE_ERR_IO, naming them, if some could not be removed. */
LFCE_API int lfce_cache_clear(double older_than_days, int64_t* removed, int64_t* bytes);

typedef struct lfce_kernel_load {
  const char* spec;
  int32_t device;
  const char* source;   /* "cubin-cache", "ptx-cache" or "llvm": where the kernel came from */
  double llvm_ms, jit_ms, disk_ms, load_ms, total_ms;
  int32_t registers, local_bytes;
} lfce_kernel_load;
typedef void (*lfce_kernel_load_callback)(const lfce_kernel_load* load, void* user);
/* How each kernel loaded in this process got there, and what it cost. */
LFCE_API int lfce_kernel_load_stats(lfce_kernel_load_callback callback, void* user);

/* ---- Autotuning (on the GPU; winners persist in the cache directory) ------------------------ */

typedef void (*lfce_tune_progress)(int64_t done, int64_t total, double eta_seconds, const char* kernel,
                                   const char* candidate, void* user);

typedef struct lfce_tune_options {
  int32_t device;
  const char* space;         /* "default", "small" or "wgmma" (sm_90a, 16-bit: the TMA + wgmma tiles alone); NULL = "default" */
  double budget_minutes;     /* stop cleanly after this long, keeping what was measured; 0 = no limit */
  int32_t verify;            /* 1: check every config's outputs against an fp64 host reference (first 300 tokens) */
  int32_t repetitions;       /* timed runs per config (median); 0 = 10 */
  lfce_tune_progress progress; /* may be NULL */
  void* user;
} lfce_tune_options;

typedef struct lfce_tune_result {
  const char* kernel;
  const char* default_config;
  const char* winner;        /* NULL when no config could be measured */
  double default_ms, winner_ms;
  double speedup;            /* default_ms / winner_ms; 0 when unknown */
  int32_t measured, reused, failed, rejected;
  const char* path;          /* the tuning file */
} lfce_tune_result;
typedef void (*lfce_tune_callback)(const lfce_tune_result* result, void* user);

/* Sweeps the config space of each GEMM kernel of the problem on options->device, persisting the
 * winners (and every measurement: a later call resumes) in the cache directory. Later forward and
 * backward calls use the winners; so do new processes. */
LFCE_API int lfce_tune(const lfce_problem* problem, const lfce_tune_options* options, lfce_tune_callback callback,
                       void* user, int32_t* stopped_by_budget);

/* Whether forward and backward of `problem` on `device` run with tuned winners: *tuned = 1 when
 * winners that lfce_tune persisted in the cache directory apply to the problem on that device's
 * arch, 0 when they run the default configs. Reads the tuning files; never tunes. */
LFCE_API int lfce_plan_is_tuned(const lfce_problem* problem, int32_t device, int32_t* tuned);

/* The version of the kernel generator this library was built with (a hash of its sources); it
 * enters every kernel cache key. */
LFCE_API const char* lfce_generator_version(void);

/* Model presets: comma-separated names, and one preset's output-layer shape. */
LFCE_API const char* lfce_preset_names(void);
LFCE_API int lfce_preset(const char* name, int64_t* hidden, int64_t* vocab);

/* Number of kernels compiled by LLVM in this process (a hook for cache tests). */
LFCE_API int64_t lfce_compile_count(void);

#ifdef __cplusplus
}
#endif
#endif /* LFCE_LFCE_H */
