// Shared by the test programs: each prints "PASS name" or
// "FAIL name: why" per check and exits non-zero on the first failure.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                          \
  do {                                                                       \
    cudaError_t e_ = (call);                                                 \
    if (e_ != cudaSuccess) {                                                 \
      printf("FAIL %s: %s at %s:%d: %s\n", TEST_NAME, #call, __FILE__,       \
             __LINE__, cudaGetErrorString(e_));                              \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define EXPECT(cond, ...)                                                    \
  do {                                                                       \
    if (!(cond)) {                                                           \
      printf("FAIL %s: ", TEST_NAME);                                        \
      printf(__VA_ARGS__);                                                   \
      printf("\n");                                                          \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static inline unsigned lcg(unsigned *s) { return *s = *s * 1664525u + 1013904223u; }
