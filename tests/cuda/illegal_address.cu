// A kernel that writes far outside its allocation: the launch fails with
// an error for this process only (the next program on the same vGPU
// runs normally).
#define TEST_NAME "illegal_address"
#include "check.h"

__global__ void wild(int *p) { p[1 << 28] = 42; }

int main() {
  int *d;
  CHECK(cudaMalloc(&d, 4096));
  wild<<<1, 1>>>(d);
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  EXPECT(e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure, "the wild write gave %s",
         cudaGetErrorString(e));
  printf("PASS %s: %s\n", TEST_NAME, cudaGetErrorName(e));
  return 0;
}
