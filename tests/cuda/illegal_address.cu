// A kernel that writes where nothing is mapped (an address handed in at
// run time, so the compiler cannot drop the store): the launch fails with
// an error, for this process only (the next program on the same vGPU, and
// the others running beside it, go on). As on a GPU the error is sticky:
// every later call of the process returns it. A GPU says
// cudaErrorIllegalAddress; a vGPU whose backend reports the fault as a
// failed launch says cudaErrorLaunchFailure, which the PASS line names.
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
  // Sticky: the context cannot be used any more.
  int *more = nullptr;
  cudaError_t again = cudaMalloc(&more, 4096);
  EXPECT(again == e, "cudaMalloc after the fault gave %s, not %s again", cudaGetErrorName(again),
         cudaGetErrorName(e));
  again = cudaDeviceSynchronize();
  EXPECT(again == e, "the next synchronisation gave %s, not %s again", cudaGetErrorName(again),
         cudaGetErrorName(e));
  printf("PASS %s: %s (%d), sticky\n", TEST_NAME, cudaGetErrorName(e), (int)e);
  return 0;
}
