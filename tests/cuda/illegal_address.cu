// A kernel that writes where nothing is mapped (an address handed in at
// run time, so the compiler cannot drop the store): the launch fails with
// an error, for this process only (the next program on the same vGPU
// runs normally).
#define TEST_NAME "illegal_address"
#include "check.h"
#include <cstdint>

__global__ void wild(int *p) { *p = 42; }

int main() {
  int *d;
  CHECK(cudaMalloc(&d, 4096));
  // Far above anything a 57-bit GPU or 47-bit user address space maps.
  int *nowhere = (int *)(uintptr_t)(0x7ff0ull << 44);
  wild<<<1, 1>>>(nowhere);
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  // As on a GPU: CUDA_ERROR_ILLEGAL_ADDRESS (700), on every backend.
  EXPECT(e == cudaErrorIllegalAddress, "the wild write gave %s (%d)", cudaGetErrorName(e),
         (int)e);
  printf("PASS %s: %s\n", TEST_NAME, cudaGetErrorName(e));
  return 0;
}
