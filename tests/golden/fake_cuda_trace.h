/* What the stand-in libcuda (tests/api/fake_libcuda.c) records of each launch, and the device
 * it pretends to be: hooks its entry points call, defined in fake_cuda_trace.c (the same
 * library). Each hook does nothing unless its environment variable is set.
 *
 *   LFCE_FAKE_CUDA_CC=90          compute capability, major * 10 + minor (default 86)
 *   LFCE_FAKE_CUDA_SMEM=bytes     opt-in shared memory per block (default 99 KiB)
 *   LFCE_FAKE_CUDA_SM_COUNT=n     multiprocessors (default 84)
 *   LFCE_FAKE_CUDA_TRACE=path     each launch and memset appended to `path`:
 *     launch <entry> ptx=<FNV-1a 64 of its PTX text> grid=x,y,z block=x,y,z cluster=x,y,z smem=<bytes>
 *       <i> <PTX param type> <value>      one line per .param of the entry, in order
 *     memset32 <address> value=<v> count=<n>
 *   A value: 64-bit integers below 2^32 in magnitude in decimal, others (addresses) in hex;
 *   32-bit ones in decimal, .f32 as %.9g, a CUtensorMap as the cuTensorMapEncodeTiled call
 *   that made it, other byte arrays in hex. While tracing, module and function handles are
 *   the fake's own records (the PTX each module was given, parsed for its entries' parameter
 *   lists), and a cubin from cuLinkComplete carries the PTX it was linked from, so that one
 *   loaded later (from lfce's disk cache) is known too.
 */
#ifndef LFCE_FAKE_CUDA_TRACE_H
#define LFCE_FAKE_CUDA_TRACE_H

#include <cuda.h>
#include <stddef.h>

/* cuDeviceGetAttribute: replaces *value where LFCE_FAKE_CUDA_CC / _SMEM / _SM_COUNT say. */
void fake_device_attribute(CUdevice_attribute attribute, int* value);
/* cuModuleLoadDataEx: while tracing, *module becomes a record of `image`'s PTX. */
void fake_trace_module(CUmodule* module, const void* image);
/* cuModuleGetFunction: while tracing, *function becomes a record of entry `name` of `module`. */
void fake_trace_function(CUfunction* function, CUmodule module, const char* name);
/* cuLinkAddData / cuLinkComplete: while tracing, the cubin carries the PTX added. */
void fake_trace_link_add(CUjitInputType type, const void* data, size_t size);
void fake_trace_link_complete(void** cubin, size_t* size);
/* cuLaunchKernel / cuLaunchKernelEx. */
void fake_trace_launch(CUfunction function, const unsigned grid[3], const unsigned block[3], const unsigned cluster[3],
                       unsigned smem, void** params);
/* cuLaunchKernelEx: the cluster dimension among `config`'s attributes (1, 1, 1 without). */
void fake_launch_cluster(const CUlaunchConfig* config, unsigned cluster[3]);
/* cuMemsetD32Async. */
void fake_trace_memset(CUdeviceptr destination, unsigned value, size_t count);
/* cuTensorMapEncodeTiled: while tracing, `map` names a record of the call's arguments. */
void fake_trace_tensor_map(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, const void* address,
                           const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                           const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                           CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob_fill);

#endif
