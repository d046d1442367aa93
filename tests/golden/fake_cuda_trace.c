/* The stand-in libcuda's launch trace and device choice (fake_cuda_trace.h says what each hook
 * does and the trace's format). Part of the fake library: the hooks are called from its entry
 * points in tests/api/fake_libcuda.c. lfce's C API is driven from one thread in the tests that
 * trace; a mutex keeps the records whole anyway. */
#include "fake_cuda_trace.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const char* trace_path(void) {
  const char* path = getenv("LFCE_FAKE_CUDA_TRACE");
  return path && *path ? path : NULL;
}

static int env_int(const char* name, int* value) {
  const char* text = getenv(name);
  if (!text || !*text) return 0;
  *value = atoi(text);
  return 1;
}

void fake_device_attribute(CUdevice_attribute attribute, int* value) {
  int v;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      if (env_int("LFCE_FAKE_CUDA_CC", &v)) *value = v / 10;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      if (env_int("LFCE_FAKE_CUDA_CC", &v)) *value = v % 10;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      if (env_int("LFCE_FAKE_CUDA_SMEM", &v)) *value = v;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      if (env_int("LFCE_FAKE_CUDA_SM_COUNT", &v)) *value = v;
      break;
    default: break;
  }
}

/* ---- Modules and functions: what the PTX says of each entry's parameters ---------------- */

enum { kMaxParams = 64, kMaxEntry = 128 };

struct Module {
  uint64_t ptx_hash;
  char* ptx; /* NULL: a cubin that does not carry its PTX */
};

struct Function {
  const struct Module* module;
  char entry[kMaxEntry];
  int params; /* -1: unknown (no PTX, or no such entry in it) */
  int bytes[kMaxParams];
  char type[kMaxParams][24];
};

static struct Function** g_functions;
static size_t g_function_count, g_function_capacity;

/* A cubin from cuLinkComplete while tracing: this prefix, then the PTX it was linked from. */
static const char kTracedCubin[] = "\x7f" "ELF fake cubin with PTX\n";

static uint64_t fnv1a(const char* text) {
  uint64_t h = 1469598103934665603ull;
  for (; *text; ++text) h = (h ^ (unsigned char)*text) * 1099511628211ull;
  return h;
}

static int type_bytes(const char* token) {
  static const struct {
    const char* name;
    int bytes;
  } kTypes[] = {{".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8}, {".u32", 4}, {".s32", 4}, {".b32", 4},
                {".f32", 4}, {".u16", 2}, {".s16", 2}, {".b16", 2}, {".f16", 2}, {".u8", 1},  {".s8", 1},
                {".b8", 1}};
  for (size_t i = 0; i < sizeof kTypes / sizeof kTypes[0]; ++i)
    if (strcmp(token, kTypes[i].name) == 0) return kTypes[i].bytes;
  return 0;
}

/* One declaration of an entry's parameter list, e.g. ".param .u64 f_param_0" or
 * ".param .align 64 .b8 f_param_9[128]". Returns 0 if it is not one. */
static int parse_param(char* decl, struct Function* f) {
  int elem = 0, count = 1;
  char type[16] = "";
  char* name = NULL;
  for (char* token = strtok(decl, " \t\r\n"); token; token = strtok(NULL, " \t\r\n")) {
    const int bytes = type_bytes(token);
    if (bytes) {
      elem = bytes;
      snprintf(type, sizeof type, "%s", token + 1);
    }
    name = token;
  }
  if (!elem || !name || f->params >= kMaxParams) return 0;
  const char* bracket = strchr(name, '[');
  if (bracket) count = atoi(bracket + 1);
  f->bytes[f->params] = elem * count;
  if (bracket)
    snprintf(f->type[f->params], sizeof f->type[0], "%s[%d]", type, count);
  else
    snprintf(f->type[f->params], sizeof f->type[0], "%s", type);
  ++f->params;
  return 1;
}

/* The parameter list of `.entry <entry>(...)` in `ptx`. */
static void parse_entry(const char* ptx, struct Function* f) {
  f->params = -1;
  if (!ptx) return;
  const size_t length = strlen(f->entry);
  for (const char* at = strstr(ptx, ".entry "); at; at = strstr(at + 1, ".entry ")) {
    const char* name = at + strlen(".entry ");
    if (strncmp(name, f->entry, length) != 0 || name[length] != '(') continue;
    const char* open = name + length;
    const char* close = strchr(open, ')');
    if (!close) return;
    char* list = strndup(open + 1, (size_t)(close - open - 1));
    f->params = 0;
    char* rest = list;
    for (char* decl = strsep(&rest, ","); decl; decl = strsep(&rest, ",")) parse_param(decl, f);
    free(list);
    return;
  }
}

void fake_trace_module(CUmodule* module, const void* image) {
  if (!trace_path()) return;
  const char* text = image;
  const char* ptx = NULL;
  if (strncmp(text, kTracedCubin, sizeof kTracedCubin - 1) == 0)
    ptx = text + sizeof kTracedCubin - 1;
  else if (strncmp(text, "\x7f" "ELF", 4) != 0)
    ptx = text;
  struct Module* m = calloc(1, sizeof *m);
  if (ptx) {
    m->ptx = strdup(ptx);
    m->ptx_hash = fnv1a(ptx);
  }
  *module = (CUmodule)m;
}

void fake_trace_function(CUfunction* function, CUmodule module, const char* name) {
  if (!trace_path()) return;
  struct Function* f = calloc(1, sizeof *f);
  f->module = (const struct Module*)module;
  snprintf(f->entry, sizeof f->entry, "%s", name);
  parse_entry(f->module->ptx, f);
  pthread_mutex_lock(&g_lock);
  if (g_function_count == g_function_capacity) {
    g_function_capacity = g_function_capacity ? 2 * g_function_capacity : 64;
    g_functions = realloc(g_functions, g_function_capacity * sizeof *g_functions);
  }
  g_functions[g_function_count++] = f;
  pthread_mutex_unlock(&g_lock);
  *function = (CUfunction)f;
}

static const struct Function* traced_function(CUfunction function) {
  for (size_t i = 0; i < g_function_count; ++i)
    if ((CUfunction)g_functions[i] == function) return g_functions[i];
  return NULL;
}

/* ---- Linking: the cubin carries its PTX --------------------------------------------------- */

static char* g_link_ptx;   /* the PTX added to the link in progress */
static char* g_link_cubin; /* the last cubin handed out (the link state's, as the driver's is) */

void fake_trace_link_add(CUjitInputType type, const void* data, size_t size) {
  if (!trace_path() || type != CU_JIT_INPUT_PTX) return;
  pthread_mutex_lock(&g_lock);
  free(g_link_ptx);
  g_link_ptx = strndup(data, size);
  pthread_mutex_unlock(&g_lock);
}

void fake_trace_link_complete(void** cubin, size_t* size) {
  if (!trace_path()) return;
  pthread_mutex_lock(&g_lock);
  if (g_link_ptx) {
    const size_t bytes = sizeof kTracedCubin - 1 + strlen(g_link_ptx) + 1;
    free(g_link_cubin);
    g_link_cubin = malloc(bytes);
    snprintf(g_link_cubin, bytes, "%s%s", kTracedCubin, g_link_ptx);
    free(g_link_ptx);
    g_link_ptx = NULL;
    *cubin = g_link_cubin;
    *size = bytes;
  }
  pthread_mutex_unlock(&g_lock);
}

/* ---- Tensor maps: the encode call's arguments ---------------------------------------------- */

/* A traced CUtensorMap: this magic, then the index of its description. */
static const char kMapMagic[8] = {'f', 'a', 'k', 'e', 't', 'm', 'a', 'p'};
static char** g_maps;
static size_t g_map_count, g_map_capacity;

static const char* map_dtype(CUtensorMapDataType type) {
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return "bf16";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16: return "fp16";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: return "fp32";
    default: return "other";
  }
}

static int append(char* out, size_t capacity, int used, const char* format, unsigned long long value, int first) {
  if (used < 0 || (size_t)used >= capacity) return used;
  return used + snprintf(out + used, capacity - used, format, first ? "" : ",", value);
}

void fake_trace_tensor_map(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, const void* address,
                           const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                           const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                           CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob_fill) {
  if (!trace_path()) return;
  char text[512];
  const size_t cap = sizeof text;
  int n = snprintf(text, cap, "tensormap(dtype=%s rank=%u address=0x%llx dims=", map_dtype(type), rank,
                   (unsigned long long)(uintptr_t)address);
  for (cuuint32_t i = 0; i < rank && i < 5; ++i) n = append(text, cap, n, "%s%llu", dims[i], i == 0);
  n += snprintf(text + n, cap - n, " strides=");
  for (cuuint32_t i = 0; i + 1 < rank && i < 4; ++i) n = append(text, cap, n, "%s%llu", strides[i], i == 0);
  n += snprintf(text + n, cap - n, " box=");
  for (cuuint32_t i = 0; i < rank && i < 5; ++i) n = append(text, cap, n, "%s%llu", box[i], i == 0);
  n += snprintf(text + n, cap - n, " element_strides=");
  for (cuuint32_t i = 0; i < rank && i < 5; ++i) n = append(text, cap, n, "%s%llu", element_strides[i], i == 0);
  snprintf(text + n, cap - n, " interleave=%d swizzle=%d l2_promotion=%d oob_fill=%d)", (int)interleave, (int)swizzle,
           (int)l2, (int)oob_fill);
  pthread_mutex_lock(&g_lock);
  if (g_map_count == g_map_capacity) {
    g_map_capacity = g_map_capacity ? 2 * g_map_capacity : 64;
    g_maps = realloc(g_maps, g_map_capacity * sizeof *g_maps);
  }
  const uint32_t index = (uint32_t)g_map_count;
  g_maps[g_map_count++] = strdup(text);
  pthread_mutex_unlock(&g_lock);
  memset(map, 0, sizeof *map);
  memcpy(map, kMapMagic, sizeof kMapMagic);
  memcpy((char*)map + sizeof kMapMagic, &index, sizeof index);
}

/* ---- Launches ------------------------------------------------------------------------------- */

/* Copies `size` bytes from `source`, or returns 0 where they cannot be read: a launch given fewer
 * arguments than its entry declares has the fake read past the caller's array (as the driver
 * would), and the trace should say so rather than crash. Through a pipe: write() fails with
 * EFAULT on an unreadable address instead of faulting. */
static int safe_copy(void* destination, const void* source, size_t size) {
  static int fds[2] = {-1, -1};
  if (fds[0] < 0 && pipe(fds) != 0) return 0;
  if (write(fds[1], source, size) != (ssize_t)size) return 0;
  return read(fds[0], destination, size) == (ssize_t)size;
}

static void print_value(FILE* out, const char* type, const unsigned char* bytes, int size) {
  if (size == 8 && !strchr(type, '[')) {
    int64_t v;
    memcpy(&v, bytes, 8);
    if (v > -(INT64_C(1) << 32) && v < (INT64_C(1) << 32))
      fprintf(out, "%lld", (long long)v);
    else
      fprintf(out, "0x%llx", (unsigned long long)v);
    return;
  }
  if (size == 4 && type[0] == 'f') {
    float v;
    memcpy(&v, bytes, 4);
    fprintf(out, "%.9g", v);
    return;
  }
  if (size == 4) {
    int32_t v;
    memcpy(&v, bytes, 4);
    fprintf(out, "%d", v);
    return;
  }
  if (size == (int)sizeof(CUtensorMap) && memcmp(bytes, kMapMagic, sizeof kMapMagic) == 0) {
    uint32_t index;
    memcpy(&index, bytes + sizeof kMapMagic, sizeof index);
    fprintf(out, "%s", index < g_map_count ? g_maps[index] : "tensormap(unknown)");
    return;
  }
  fprintf(out, "0x");
  for (int i = size - 1; i >= 0; --i) fprintf(out, "%02x", bytes[i]);  /* little-endian, as a number */
}

void fake_trace_launch(CUfunction function, const unsigned grid[3], const unsigned block[3], const unsigned cluster[3],
                       unsigned smem, void** params) {
  const char* path = trace_path();
  if (!path) return;
  pthread_mutex_lock(&g_lock);
  FILE* out = fopen(path, "a");
  if (out) {
    const struct Function* f = traced_function(function);
    fprintf(out, "launch %s ptx=%016llx grid=%u,%u,%u block=%u,%u,%u cluster=%u,%u,%u smem=%u\n",
            f ? f->entry : "unknown", (unsigned long long)(f && f->module->ptx ? f->module->ptx_hash : 0), grid[0],
            grid[1], grid[2], block[0], block[1], block[2], cluster[0], cluster[1], cluster[2], smem);
    if (!f || f->params < 0) fprintf(out, "  parameters unknown\n");
    for (int i = 0; f && i < f->params; ++i) {
      fprintf(out, "  %d %s ", i, f->type[i]);
      void* value = NULL;
      unsigned char bytes[256];
      if (f->bytes[i] <= (int)sizeof bytes && safe_copy(&value, &params[i], sizeof value) &&
          safe_copy(bytes, value, (size_t)f->bytes[i]))
        print_value(out, f->type[i], bytes, f->bytes[i]);
      else
        fprintf(out, "unreadable");
      fprintf(out, "\n");
    }
    fclose(out);
  }
  pthread_mutex_unlock(&g_lock);
}

void fake_launch_cluster(const CUlaunchConfig* config, unsigned cluster[3]) {
  cluster[0] = cluster[1] = cluster[2] = 1;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    if (config->attrs[i].id != CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) continue;
    cluster[0] = config->attrs[i].value.clusterDim.x;
    cluster[1] = config->attrs[i].value.clusterDim.y;
    cluster[2] = config->attrs[i].value.clusterDim.z;
  }
}

void fake_trace_memset(CUdeviceptr destination, unsigned value, size_t count) {
  const char* path = trace_path();
  if (!path) return;
  pthread_mutex_lock(&g_lock);
  FILE* out = fopen(path, "a");
  if (out) {
    fprintf(out, "memset32 0x%llx value=%u count=%zu\n", (unsigned long long)destination, value, count);
    fclose(out);
  }
  pthread_mutex_unlock(&g_lock);
}
