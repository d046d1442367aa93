/* A stand-in for libcuda.so.1, for tests without a GPU (LFCE_LIBCUDA points at it). It exports
 * cuGetProcAddress_v2, the only symbol runtime/driver.cpp looks up, and hands out entry points
 * that succeed without doing anything: one sm_86-class device with 99 KiB of shared memory per
 * block, contexts, modules and device memory that are bare handles, launches that run nothing.
 *
 * Environment (read at each call):
 *   LFCE_FAKE_CUDA_FAIL=name        the entry point `name` (e.g. cuLaunchKernel) returns an error
 *   LFCE_FAKE_CUDA_ERROR=code       that error's code (default 2, CUDA_ERROR_OUT_OF_MEMORY)
 *   LFCE_FAKE_CUDA_UNRESOLVED=name  cuGetProcAddress_v2 does not find `name`
 *   LFCE_FAKE_CUDA_LOG=path         each entry point called is appended to `path`, one per line
 *   LFCE_FAKE_CUDA_CC, LFCE_FAKE_CUDA_SMEM, LFCE_FAKE_CUDA_SM_COUNT, LFCE_FAKE_CUDA_TRACE
 *                                   another device, and a trace of every launch: see
 *                                   tests/golden/fake_cuda_trace.h
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../golden/fake_cuda_trace.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

static int g_handle;              /* what every context, module, function and event points at */
static CUcontext g_current;       /* the calling thread's current context (one thread is enough) */
static CUdeviceptr g_next = 1ull << 32; /* device addresses: never dereferenced */
/* What cuLinkComplete hands out: an ELF magic, so that lfce takes it for a cubin. */
static const char kCubin[] = "\x7f" "ELF fake cubin";

/* Logs `name` and says whether it is the entry point that must fail. */
static int failing(const char* name) {
  const char* log = getenv("LFCE_FAKE_CUDA_LOG");
  if (log && *log) {
    FILE* f = fopen(log, "a");
    if (f) {
      fprintf(f, "%s\n", name);
      fclose(f);
    }
  }
  const char* fail = getenv("LFCE_FAKE_CUDA_FAIL");
  return fail && strcmp(fail, name) == 0;
}

static CUresult fail_code(void) {
  const char* code = getenv("LFCE_FAKE_CUDA_ERROR");
  return code && *code ? (CUresult)atoi(code) : CUDA_ERROR_OUT_OF_MEMORY;
}

#define ENTER(name)                       \
  do {                                    \
    if (failing(name)) return fail_code(); \
  } while (0)

static CUresult fake_cuInit(unsigned flags) {
  ENTER("cuInit");
  return CUDA_SUCCESS;
}
static CUresult fake_cuDriverGetVersion(int* version) {
  ENTER("cuDriverGetVersion");
  *version = 12080;
  return CUDA_SUCCESS;
}
static CUresult fake_cuDeviceGet(CUdevice* device, int ordinal) {
  ENTER("cuDeviceGet");
  *device = ordinal;
  return CUDA_SUCCESS;
}
static CUresult fake_cuDeviceGetCount(int* count) {
  ENTER("cuDeviceGetCount");
  *count = 1;
  return CUDA_SUCCESS;
}
static CUresult fake_cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  ENTER("cuDeviceGetAttribute");
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 8; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 6; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 84; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = 99 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    default: *value = 0;
  }
  fake_device_attribute(attribute, value);
  return CUDA_SUCCESS;
}
static CUresult fake_cuDeviceGetName(char* name, int length, CUdevice device) {
  ENTER("cuDeviceGetName");
  snprintf(name, (size_t)length, "lfce fake GPU");
  return CUDA_SUCCESS;
}
static CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  ENTER("cuDevicePrimaryCtxRetain");
  *context = (CUcontext)&g_handle;
  return CUDA_SUCCESS;
}
static CUresult fake_cuCtxGetCurrent(CUcontext* context) {
  ENTER("cuCtxGetCurrent");
  *context = g_current;
  return CUDA_SUCCESS;
}
static CUresult fake_cuCtxSetCurrent(CUcontext context) {
  ENTER("cuCtxSetCurrent");
  g_current = context;
  return CUDA_SUCCESS;
}
static CUresult fake_cuCtxGetDevice(CUdevice* device) {
  ENTER("cuCtxGetDevice");
  *device = 0;
  return CUDA_SUCCESS;
}
static CUresult fake_cuCtxSynchronize(void) {
  ENTER("cuCtxSynchronize");
  return CUDA_SUCCESS;
}
static CUresult fake_cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned n, CUjit_option* options,
                                        void** values) {
  ENTER("cuModuleLoadDataEx");
  *module = (CUmodule)&g_handle;
  fake_trace_module(module, image);
  return CUDA_SUCCESS;
}
static CUresult fake_cuModuleUnload(CUmodule module) {
  ENTER("cuModuleUnload");
  return CUDA_SUCCESS;
}
static CUresult fake_cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  ENTER("cuModuleGetFunction");
  *function = (CUfunction)&g_handle;
  fake_trace_function(function, module, name);
  return CUDA_SUCCESS;
}
static CUresult fake_cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value) {
  ENTER("cuFuncSetAttribute");
  return CUDA_SUCCESS;
}
static CUresult fake_cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction function) {
  ENTER("cuFuncGetAttribute");
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 64; break;
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    default: *value = 0;
  }
  return CUDA_SUCCESS;
}
static CUresult fake_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned smem, CUstream stream, void** params, void** extra) {
  ENTER("cuLaunchKernel");
  {
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz}, cluster[3] = {1, 1, 1};
    fake_trace_launch(f, grid, block, cluster, smem, params);
  }
  return CUDA_SUCCESS;
}
static CUresult fake_cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  ENTER("cuLaunchKernelEx");
  {
    const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    unsigned cluster[3];
    fake_launch_cluster(config, cluster);
    fake_trace_launch(f, grid, block, cluster, config->sharedMemBytes, params);
  }
  return CUDA_SUCCESS;
}
static CUresult fake_cuGetErrorName(CUresult code, const char** name) {
  ENTER("cuGetErrorName");
  switch (code) {
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
static CUresult fake_cuGetErrorString(CUresult code, const char** text) {
  ENTER("cuGetErrorString");
  *text = "an error made by the fake libcuda";
  return CUDA_SUCCESS;
}
static CUresult fake_cuMemsetD32Async(CUdeviceptr destination, unsigned value, size_t count, CUstream stream) {
  ENTER("cuMemsetD32Async");
  fake_trace_memset(destination, value, count);
  return CUDA_SUCCESS;
}
static CUresult fake_cuLinkCreate(unsigned n, CUjit_option* options, void** values, CUlinkState* state) {
  ENTER("cuLinkCreate");
  *state = (CUlinkState)&g_handle;
  return CUDA_SUCCESS;
}
static CUresult fake_cuLinkAddData(CUlinkState state, CUjitInputType type, void* data, size_t size, const char* name,
                                   unsigned n, CUjit_option* options, void** values) {
  ENTER("cuLinkAddData");
  fake_trace_link_add(type, data, size);
  return CUDA_SUCCESS;
}
static CUresult fake_cuLinkComplete(CUlinkState state, void** cubin, size_t* size) {
  ENTER("cuLinkComplete");
  *cubin = (void*)kCubin;
  *size = sizeof kCubin;
  fake_trace_link_complete(cubin, size);
  return CUDA_SUCCESS;
}
static CUresult fake_cuLinkDestroy(CUlinkState state) {
  ENTER("cuLinkDestroy");
  return CUDA_SUCCESS;
}
static CUresult fake_cuMemAlloc(CUdeviceptr* ptr, size_t bytes) {
  ENTER("cuMemAlloc");
  *ptr = g_next;
  g_next += (bytes + 4095) / 4096 * 4096 + 4096;
  return CUDA_SUCCESS;
}
static CUresult fake_cuMemFree(CUdeviceptr ptr) {
  ENTER("cuMemFree");
  return CUDA_SUCCESS;
}
static CUresult fake_cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  ENTER("cuMemcpyHtoD");
  return CUDA_SUCCESS;
}
static CUresult fake_cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  ENTER("cuMemcpyDtoH");
  memset(dst, 0, bytes);
  return CUDA_SUCCESS;
}
static CUresult fake_cuEventCreate(CUevent* event, unsigned flags) {
  ENTER("cuEventCreate");
  *event = (CUevent)&g_handle;
  return CUDA_SUCCESS;
}
static CUresult fake_cuEventRecord(CUevent event, CUstream stream) {
  ENTER("cuEventRecord");
  return CUDA_SUCCESS;
}
static CUresult fake_cuEventSynchronize(CUevent event) {
  ENTER("cuEventSynchronize");
  return CUDA_SUCCESS;
}
static CUresult fake_cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  ENTER("cuEventElapsedTime");
  *ms = 1.0f;
  return CUDA_SUCCESS;
}
static CUresult fake_cuEventDestroy(CUevent event) {
  ENTER("cuEventDestroy");
  return CUDA_SUCCESS;
}

static CUresult fake_cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                            const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                            const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                            CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                            CUtensorMapFloatOOBfill oob_fill) {
  ENTER("cuTensorMapEncodeTiled");
  memset(map, 0, sizeof *map);
  fake_trace_tensor_map(map, type, rank, address, dims, strides, box, element_strides, interleave, swizzle, l2,
                        oob_fill);
  return CUDA_SUCCESS;
}

struct EntryPoint {
  const char* name;
  void* function;
};
#define ENTRY(name) {#name, (void*)fake_##name}
static const struct EntryPoint kEntryPoints[] = {
    ENTRY(cuInit),           ENTRY(cuDriverGetVersion),  ENTRY(cuDeviceGet),
    ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGetAttribute), ENTRY(cuDeviceGetName),
    ENTRY(cuDevicePrimaryCtxRetain), ENTRY(cuCtxGetCurrent), ENTRY(cuCtxSetCurrent),
    ENTRY(cuCtxGetDevice),   ENTRY(cuCtxSynchronize),    ENTRY(cuModuleLoadDataEx),
    ENTRY(cuModuleUnload),   ENTRY(cuModuleGetFunction), ENTRY(cuFuncSetAttribute),
    ENTRY(cuFuncGetAttribute), ENTRY(cuLaunchKernel),    ENTRY(cuGetErrorName),
    ENTRY(cuGetErrorString), ENTRY(cuMemsetD32Async),    ENTRY(cuLinkCreate),
    ENTRY(cuLinkAddData),    ENTRY(cuLinkComplete),      ENTRY(cuLinkDestroy),
    ENTRY(cuMemAlloc),       ENTRY(cuMemFree),           ENTRY(cuMemcpyHtoD),
    ENTRY(cuMemcpyDtoH),     ENTRY(cuEventCreate),       ENTRY(cuEventRecord),
    ENTRY(cuEventSynchronize), ENTRY(cuEventElapsedTime), ENTRY(cuEventDestroy),
    ENTRY(cuTensorMapEncodeTiled), ENTRY(cuLaunchKernelEx),
};

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** function, int version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* found) {
  const char* unresolved = getenv("LFCE_FAKE_CUDA_UNRESOLVED");
  *function = NULL;
  if (found) *found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (unresolved && strcmp(unresolved, symbol) == 0) return CUDA_ERROR_NOT_FOUND;
  for (size_t i = 0; i < sizeof kEntryPoints / sizeof kEntryPoints[0]; ++i) {
    if (strcmp(kEntryPoints[i].name, symbol) == 0) {
      *function = kEntryPoints[i].function;
      if (found) *found = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}
