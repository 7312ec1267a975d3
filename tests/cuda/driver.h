// For the test programs that call the driver API itself: each entry point
// is looked up in libcuda.so.1 (the one the runtime uses), so a program
// needs no link against a driver stub.
#pragma once
#include "check.h"
#include <cuda.h>
#include <dlfcn.h>

#define DRV(call)                                                            \
  do {                                                                       \
    CUresult r_ = (call);                                                    \
    EXPECT(r_ == CUDA_SUCCESS, "%s returned %d", #call, (int)r_);            \
  } while (0)

// SYM(cuFoo) declares `cuFoo`, the library's entry point of that name.
#define SYM(name) auto name = (decltype(&::name))driver_sym(#name)

static inline void *driver_sym(const char *name) {
  static void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  EXPECT(lib != nullptr, "dlopen: %s", dlerror());
  void *p = dlsym(lib, name);
  EXPECT(p != nullptr, "libcuda.so.1 has no %s", name);
  return p;
}
