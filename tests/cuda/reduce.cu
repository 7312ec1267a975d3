// A sum reduction: warp shuffles within a warp, shared memory across the
// block's warps, one atomicAdd per block.
#define TEST_NAME "reduce"
#include "check.h"

__global__ void reduce_sum(const int *x, unsigned long long *out, int n) {
  __shared__ int warp_sums[32];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int v = i < n ? x[i] : 0;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x / 32) ? warp_sums[lane] : 0;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) atomicAdd(out, (unsigned long long)(long long)v);
  }
}

int main() {
  const int n = 1 << 18;
  int *x = (int *)malloc(n * 4);
  long long want = 0;
  unsigned s = 3;
  for (int i = 0; i < n; i++) {
    x[i] = (int)(lcg(&s) % 2001) - 1000;
    want += x[i];
  }
  int *dx;
  unsigned long long *dout, got = 0;
  CHECK(cudaMalloc(&dx, n * 4));
  CHECK(cudaMalloc(&dout, 8));
  CHECK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dout, 0, 8));
  reduce_sum<<<n / 256, 256>>>(dx, dout, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(&got, dout, 8, cudaMemcpyDeviceToHost));
  EXPECT((long long)got == want, "sum %lld, want %lld", (long long)got, want);
  printf("PASS %s n=%d sum=%lld\n", TEST_NAME, n, want);
  return 0;
}
