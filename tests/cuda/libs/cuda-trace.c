// cuda-trace: a libcuda.so.1 that forwards every call to another CUDA
// driver and writes one line per call to stderr: the function, its first
// six integer arguments, what it returned, a few out-parameters, and how
// long the call took. It wraps what cuGetProcAddress hands out and the
// functions of the private tables cuGetExportTable hands out, so calls
// through the runtime's tables are seen too. Run the same program natively
// and on a vGPU and compare the two traces; with CUDA_TRACE=summary it
// prints only, at exit, each function's calls and time (where a
// launch-bound program spends its host time).
//
//   CUDA_TRACE_REAL=/path/libcuda.so.1   the driver to forward to (required)
//   CUDA_TRACE=summary                   counts and times only
//   CUDA_TRACE_REFUSE=NAME,...           these functions answer
//                                        CUDA_ERROR_NOT_SUPPORTED without
//                                        reaching the driver (names as the
//                                        trace prints them, such as
//                                        cuTensorMapEncodeTiled or
//                                        table-1734dc26[4])
//   CUDA_TRACE_ATTR=ATTR=VALUE,...       cuDeviceGetAttribute answers VALUE
//                                        for these attributes
// The last two make the real driver answer as a vGPU's library does, so
// a native run shows what one of its answers costs a program.
//
// The exported names are generated from the real driver's (build.sh), each
// a two-instruction stub into trace_common (x86-64 only). Built with
// NVML's names instead, it traces libnvidia-ml.so.1 the same way.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

extern const char *const trace_export_names[];
extern const unsigned trace_export_count;

#define MAX_FNS 8192
#define MAX_DEPTH 64
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define MAX_ATTRS 64

struct fn {
  char name[96];
  void *real;
  uint64_t calls;
  uint64_t ns;
  int refused;
};

struct frame {
  void *ret;
  unsigned idx;
  uint64_t a[6];
  uint64_t t0;
  // For private-table functions: 32 bytes at each of the first four
  // arguments, when they point at readable memory (what they write).
  unsigned char mem[4][32];
  unsigned char readable;
};

static struct fn fns[MAX_FNS];
static unsigned nfns;
static pthread_mutex_t fns_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void *real_lib;
static int summary;
static uint64_t t_start;
static unsigned char *thunks;
static unsigned nthunks;
static const char *refuse_list;
static int attr_ids[MAX_ATTRS], attr_values[MAX_ATTRS];
static unsigned nattrs;
static __thread struct frame frames[MAX_DEPTH];
static __thread int depth;

void trace_common(void);

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if (n > (int)sizeof buf - 2)
    n = sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t w = write(2, buf, (size_t)n);
  (void)w;
}

// Reads 32 bytes at `p` without faulting on a bad address.
static int peek(uint64_t p, unsigned char *out) {
  if (p < 0x10000)
    return 0;
  struct iovec local = {out, 32}, remote = {(void *)(uintptr_t)p, 32};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == 32;
}

static void hex32(const unsigned char *m, char *out) {
  for (int i = 0; i < 32; i++)
    sprintf(out + 2 * i, "%02x", m[i]);
}

static int missing(void) { return CUDA_ERROR_NOT_FOUND; }
static int not_supported(void) { return CUDA_ERROR_NOT_SUPPORTED; }

// Whether `name` (less a "(ptsz)" suffix) is in CUDA_TRACE_REFUSE's
// comma-separated list.
static int refused(const char *name) {
  size_t n = strcspn(name, "(");
  for (const char *p = refuse_list; p && *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0)
      return 1;
    p = end ? end + 1 : NULL;
  }
  return 0;
}

static void parse_attrs(const char *spec) {
  for (const char *p = spec; p && *p && nattrs < MAX_ATTRS;) {
    int id, value;
    if (sscanf(p, "%d=%d", &id, &value) == 2) {
      attr_ids[nattrs] = id;
      attr_values[nattrs++] = value;
    }
    p = strchr(p, ',');
    p = p ? p + 1 : NULL;
  }
}

static void report(void) {
  if (!summary)
    return;
  say("cuda-trace: %.3f s in all", (double)(now_ns() - t_start) / 1e9);
  for (unsigned i = 0; i < nfns; i++)
    if (fns[i].calls)
      say("cuda-trace: %-48s %10" PRIu64 " calls %12.3f ms %9.2f us/call",
          fns[i].name, fns[i].calls, (double)fns[i].ns / 1e6,
          (double)fns[i].ns / 1e3 / (double)fns[i].calls);
}

static void init(void) {
  const char *path = getenv("CUDA_TRACE_REAL");
  const char *mode = getenv("CUDA_TRACE");
  summary = mode && strcmp(mode, "summary") == 0;
  refuse_list = getenv("CUDA_TRACE_REFUSE");
  parse_attrs(getenv("CUDA_TRACE_ATTR"));
  t_start = now_ns();
  if (!path) {
    say("cuda-trace: CUDA_TRACE_REAL is not set");
    abort();
  }
  real_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!real_lib) {
    say("cuda-trace: %s", dlerror());
    abort();
  }
  for (unsigned i = 0; i < trace_export_count && i < MAX_FNS; i++) {
    snprintf(fns[i].name, sizeof fns[i].name, "%s", trace_export_names[i]);
    fns[i].real = dlsym(real_lib, trace_export_names[i]);
    fns[i].refused = refused(fns[i].name);
  }
  nfns = trace_export_count;
  thunks = mmap(NULL, 32 * 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (thunks == MAP_FAILED) {
    say("cuda-trace: no memory for thunks");
    abort();
  }
  atexit(report);
}

// A callable that enters trace_common as function `name` calling `real`.
static void *thunk(const char *name, void *real) {
  pthread_mutex_lock(&fns_lock);
  for (unsigned i = trace_export_count; i < nfns; i++)
    if (fns[i].real == real && strcmp(fns[i].name, name) == 0) {
      pthread_mutex_unlock(&fns_lock);
      return thunks + 32 * (i - trace_export_count);
    }
  if (nfns >= MAX_FNS || nthunks >= 4096) {
    pthread_mutex_unlock(&fns_lock);
    return real;
  }
  unsigned idx = nfns;
  snprintf(fns[idx].name, sizeof fns[idx].name, "%s", name);
  fns[idx].real = real;
  fns[idx].refused = refused(fns[idx].name);
  unsigned char *p = thunks + 32 * nthunks++;
  uint64_t i64 = idx, c64 = (uint64_t)(uintptr_t)trace_common;
  p[0] = 0x49; // movabs $idx, %r11
  p[1] = 0xbb;
  memcpy(p + 2, &i64, 8);
  p[10] = 0x49; // movabs $trace_common, %r10
  p[11] = 0xba;
  memcpy(p + 12, &c64, 8);
  p[20] = 0x41; // jmp *%r10
  p[21] = 0xff;
  p[22] = 0xe2;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  nfns = idx + 1;
  pthread_mutex_unlock(&fns_lock);
  return p;
}

// Whether `p` is in an executable mapping (a function, not data).
static int executable(uint64_t p) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return 0;
  char line[512];
  int yes = 0;
  while (fgets(line, sizeof line, f)) {
    uint64_t lo, hi;
    char perms[8];
    if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s", &lo, &hi, perms) == 3 &&
        p >= lo && p < hi) {
      yes = perms[2] == 'x';
      break;
    }
  }
  fclose(f);
  return yes;
}

struct table {
  unsigned char id[16];
  const void *real;
  void **copy;
};
static struct table tables[32];
static unsigned ntables;

// A copy of a private table whose functions are thunks. The tables whose
// addresses the runtime's integrity check hashes stay as they are.
static const void *wrap_table(const unsigned char *id, const void *real) {
  static const unsigned char keep[][4] = {{0x6b, 0xd5, 0xfb, 0x6c},
                                          {0xd4, 0x08, 0x20, 0x55}};
  for (unsigned k = 0; k < 2; k++)
    if (memcmp(id, keep[k], 4) == 0)
      return real;
  pthread_mutex_lock(&fns_lock);
  for (unsigned i = 0; i < ntables; i++)
    if (tables[i].real == real) {
      pthread_mutex_unlock(&fns_lock);
      return tables[i].copy;
    }
  pthread_mutex_unlock(&fns_lock);
  const uint64_t *t = real;
  unsigned n, first;
  if (t[0] > 0 && t[0] < 8192 && t[0] % 8 == 0) {
    n = (unsigned)(t[0] / 8);
    first = 1;
  } else {
    n = 4; // context-local storage: no size word
    first = 0;
  }
  if (ntables >= 32)
    return real;
  void **copy = malloc(n * sizeof *copy);
  if (!copy)
    return real;
  for (unsigned i = 0; i < n; i++) {
    copy[i] = (void *)(uintptr_t)t[i];
    if (i >= first && t[i] && executable(t[i])) {
      char name[96];
      snprintf(name, sizeof name, "table-%02x%02x%02x%02x[%u]", id[0], id[1],
               id[2], id[3], i);
      copy[i] = thunk(name, (void *)(uintptr_t)t[i]);
    }
  }
  pthread_mutex_lock(&fns_lock);
  memcpy(tables[ntables].id, id, 16);
  tables[ntables].real = real;
  tables[ntables].copy = copy;
  ntables++;
  pthread_mutex_unlock(&fns_lock);
  return copy;
}

// Called by trace_common with the function's index, the caller's return
// address and the saved argument registers (r9, r8, rcx, rdx, rsi, rdi).
__attribute__((visibility("hidden"))) void *trace_enter(uint64_t idx,
                                                        void *ret,
                                                        const uint64_t *regs) {
  pthread_once(&once, init);
  if (depth >= MAX_DEPTH) {
    say("cuda-trace: calls nested too deep");
    abort();
  }
  struct frame *f = &frames[depth++];
  f->ret = ret;
  f->idx = (unsigned)idx;
  for (int i = 0; i < 6; i++)
    f->a[i] = regs[5 - i];
  f->readable = 0;
  if (idx < nfns && strncmp(fns[idx].name, "table-", 6) == 0 && !summary)
    for (int i = 0; i < 4; i++)
      if (peek(f->a[i], f->mem[i]))
        f->readable |= (unsigned char)(1u << i);
  f->t0 = now_ns();
  if (idx < nfns && fns[idx].refused)
    return (void *)not_supported;
  void *real = idx < nfns ? fns[idx].real : NULL;
  return real ? real : (void *)missing;
}

static int is(const char *name, const char *base) {
  size_t n = strlen(base);
  return strncmp(name, base, n) == 0 &&
         (name[n] == 0 || name[n] == '_');
}

__attribute__((visibility("hidden"))) void *trace_leave(uint64_t rc64) {
  uint64_t t1 = now_ns();
  struct frame *f = &frames[--depth];
  struct fn *fn = &fns[f->idx];
  int rc = (int)rc64;
  __atomic_add_fetch(&fn->calls, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&fn->ns, t1 - f->t0, __ATOMIC_RELAXED);
  const char *name = fn->name;
  const uint64_t *a = f->a;
  if (is(name, "cuGetProcAddress") && rc == 0 && a[1]) {
    void **pfn = (void **)(uintptr_t)a[1];
    if (*pfn) {
      char n[96];
      snprintf(n, sizeof n, "%s%s", (const char *)(uintptr_t)a[0],
               a[3] & 2 ? "(ptsz)" : "");
      *pfn = thunk(n, *pfn);
    }
  }
  // NVML hands out private tables the same way.
  if (is(name, "cuDeviceGetAttribute") && rc == 0 && a[0])
    for (unsigned i = 0; i < nattrs; i++)
      if (attr_ids[i] == (int)a[1])
        *(int *)(uintptr_t)a[0] = attr_values[i];
  int export_table =
      is(name, "cuGetExportTable") || is(name, "nvmlInternalGetExportTable");
  if (export_table && rc == 0 && a[0] && a[1])
    *(const void **)(uintptr_t)a[0] =
        wrap_table((const unsigned char *)(uintptr_t)a[1],
                   *(const void **)(uintptr_t)a[0]);
  if (summary)
    return f->ret;
  char extra[160] = "";
  if (is(name, "cuGetProcAddress") && a[0])
    snprintf(extra, sizeof extra, " \"%s\" v%d flags %" PRIu64 "%s",
             (const char *)(uintptr_t)a[0], (int)a[2], a[3],
             a[1] && !*(void **)(uintptr_t)a[1] ? " -> null" : "");
  else if (export_table && a[1]) {
    const unsigned char *u = (const unsigned char *)(uintptr_t)a[1];
    snprintf(extra, sizeof extra,
             " %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
             u[11], u[12], u[13], u[14], u[15]);
  } else if ((is(name, "cuModuleGetGlobal") || is(name, "cuLibraryGetGlobal")) &&
             a[3])
    snprintf(extra, sizeof extra, " \"%.100s\" -> %#" PRIx64 " size %" PRIu64,
             (const char *)(uintptr_t)a[3],
             rc == 0 && a[0] ? *(uint64_t *)(uintptr_t)a[0] : 0,
             rc == 0 && a[1] ? *(uint64_t *)(uintptr_t)a[1] : 0);
  else if ((is(name, "cuOccupancyMaxActiveClusters") || is(name, "cuLaunchKernelEx")) &&
           a[is(name, "cuLaunchKernelEx") ? 0 : 2]) {
    // The launch configuration: its shape and its cluster attribute.
    const uint32_t *c = (const uint32_t *)(uintptr_t)a[is(name, "cuLaunchKernelEx") ? 0 : 2];
    const unsigned char *attrs = *(const unsigned char *const *)(c + 10);
    unsigned nattrs = c[12];
    uint32_t cl[3] = {1, 1, 1};
    for (unsigned i = 0; attrs && i < nattrs && i < 16; i++) {
      const uint32_t *at = (const uint32_t *)(attrs + 72 * i);
      if (at[0] == 4) // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        memcpy(cl, at + 2, sizeof cl);
    }
    int n = snprintf(extra, sizeof extra,
                     " grid %ux%ux%u block %ux%ux%u shared %u cluster %ux%ux%u, %u attrs",
                     c[0], c[1], c[2], c[3], c[4], c[5], c[6], cl[0], cl[1], cl[2], nattrs);
    if (!is(name, "cuLaunchKernelEx") && rc == 0 && a[0] && n > 0 && n < (int)sizeof extra)
      snprintf(extra + n, sizeof extra - (size_t)n, " -> %d", *(int *)(uintptr_t)a[0]);
  } else if ((is(name, "cuModuleGetFunction") || is(name, "cuLibraryGetKernel")) &&
           a[2])
    snprintf(extra, sizeof extra, " \"%.120s\"", (const char *)(uintptr_t)a[2]);
  else if (rc == 0 && a[0] &&
           (is(name, "cuDeviceGetAttribute") || is(name, "cuFuncGetAttribute") ||
            is(name, "cuKernelGetAttribute") || is(name, "cuDriverGetVersion") ||
            is(name, "cuDeviceGetCount") || is(name, "cuCtxGetDevice") ||
            is(name, "cuDeviceGet") || is(name, "cuOccupancyMaxActiveBlocksPerMultiprocessor") ||
            is(name, "cuOccupancyMaxActiveClusters") ||
            is(name, "cuOccupancyMaxPotentialClusterSize") ||
            is(name, "cuCtxGetApiVersion") || is(name, "cuCtxGetFlags") ||
            is(name, "cuDeviceComputeCapability") || is(name, "cuPointerGetAttribute") ||
            is(name, "cuStreamGetPriority") || is(name, "cuCtxGetStreamPriorityRange")))
    snprintf(extra, sizeof extra, " -> %d", *(int *)(uintptr_t)a[0]);
  else if (rc == 0 && a[0] &&
           (is(name, "cuCtxGetLimit") || is(name, "cuMemGetInfo") ||
            is(name, "cuDeviceTotalMem") ||
            is(name, "cuOccupancyAvailableDynamicSMemPerBlock") ||
            is(name, "cuMemAlloc") || is(name, "cuCtxGetCurrent") ||
            is(name, "cuDevicePrimaryCtxRetain")))
    snprintf(extra, sizeof extra, " -> %#" PRIx64, *(uint64_t *)(uintptr_t)a[0]);
  else if (rc == 0 && is(name, "cuDeviceGetName") && a[0])
    snprintf(extra, sizeof extra, " -> \"%.100s\"", (const char *)(uintptr_t)a[0]);
  for (int i = 0; i < 4; i++) {
    unsigned char after[32];
    if (!(f->readable & (1u << i)) || !peek(a[i], after))
      continue;
    char h0[65], h1[65];
    if (memcmp(after, f->mem[i], 32) == 0) {
      // What a private table's caller passes in tells what the slot is for.
      if (strncmp(name, "table-", 6) == 0) {
        hex32(after, h0);
        say("cuda-trace: %*s  arg %d at %#" PRIx64 ": %s", 2 * depth, "", i,
            a[i], h0);
      }
      continue;
    }
    hex32(f->mem[i], h0);
    hex32(after, h1);
    say("cuda-trace: %*s  arg %d at %#" PRIx64 ": %s -> %s", 2 * depth, "", i,
        a[i], h0, h1);
  }
  say("cuda-trace: %*s%s(%#" PRIx64 ", %#" PRIx64 ", %#" PRIx64 ", %#" PRIx64
      ", %#" PRIx64 ", %#" PRIx64 ") = %d%s [%.1f us]",
      2 * depth, "", name, a[0], a[1], a[2], a[3], a[4], a[5], rc, extra,
      (double)(t1 - f->t0) / 1e3);
  return f->ret;
}

// Saves the argument registers, asks trace_enter for the real function,
// calls it in the caller's place (its stack arguments where it expects
// them), then reports the result and returns to the caller.
__asm__(".text\n"
        ".globl trace_common\n"
        ".hidden trace_common\n"
        ".type trace_common,@function\n"
        "trace_common:\n"
        "  push %rdi\n  push %rsi\n  push %rdx\n  push %rcx\n  push %r8\n"
        "  push %r9\n  sub $8, %rsp\n"
        "  mov %r11, %rdi\n  mov 56(%rsp), %rsi\n  lea 8(%rsp), %rdx\n"
        "  call trace_enter\n"
        "  mov %rax, %r11\n  add $8, %rsp\n"
        "  pop %r9\n  pop %r8\n  pop %rcx\n  pop %rdx\n  pop %rsi\n  pop %rdi\n"
        "  add $8, %rsp\n"
        "  call *%r11\n"
        "  push %rax\n  push %rax\n  mov %rax, %rdi\n"
        "  call trace_leave\n"
        "  mov %rax, %r11\n  pop %rax\n  pop %rax\n"
        "  jmp *%r11\n");
