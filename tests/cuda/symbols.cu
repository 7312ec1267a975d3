// Module variables: __device__ and __constant__ variables set and read
// with cudaMemcpyToSymbol / cudaMemcpyFromSymbol, their initial values,
// their address and size, and values that persist from launch to launch.
#define TEST_NAME "symbols"
#include "check.h"
#include <cmath>

__device__ int counter;
__device__ int start_value = 42;
__device__ int squares[256];
__constant__ float coeffs[4];

// y = c0 + c1 x + c2 x^2 + c3 x^3 for each x; counts the threads that ran.
__global__ void poly(const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  y[i] = coeffs[0] + v * (coeffs[1] + v * (coeffs[2] + v * coeffs[3]));
  atomicAdd(&counter, 1);
  if (i < 256) squares[i] = i * i + start_value;
}

int main() {
  const int n = 1000;
  int init = 0;
  CHECK(cudaMemcpyFromSymbol(&init, start_value, sizeof(int)));
  EXPECT(init == 42, "start_value reads %d before any launch, want 42", init);

  void *addr = nullptr;
  size_t size = 0;
  CHECK(cudaGetSymbolAddress(&addr, squares));
  CHECK(cudaGetSymbolSize(&size, squares));
  EXPECT(addr != nullptr && size == 256 * sizeof(int), "squares at %p, %zu bytes", addr, size);

  float c[4] = {1.0f, -2.0f, 0.5f, 0.25f};
  CHECK(cudaMemcpyToSymbol(coeffs, c, sizeof(c)));
  int zero = 0;
  CHECK(cudaMemcpyToSymbol(counter, &zero, sizeof(int)));
  float hx[n], hy[n];
  for (int i = 0; i < n; i++) hx[i] = (i % 17) * 0.25f - 2.0f;
  float *dx, *dy;
  CHECK(cudaMalloc(&dx, n * 4));
  CHECK(cudaMalloc(&dy, n * 4));
  CHECK(cudaMemcpy(dx, hx, n * 4, cudaMemcpyHostToDevice));
  poly<<<(n + 127) / 128, 128>>>(dx, dy, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(hy, dy, n * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) {
    float v = hx[i];
    float want = c[0] + v * (c[1] + v * (c[2] + v * c[3]));
    EXPECT(std::fabs(hy[i] - want) <= 1e-5f * (1.0f + std::fabs(want)), "y[%d] = %g, want %g",
           i, hy[i], want);
  }
  int count = 0;
  CHECK(cudaMemcpyFromSymbol(&count, counter, sizeof(int)));
  EXPECT(count == n, "counter %d after one launch, want %d", count, n);

  // The variable keeps its value: a second launch adds to it; a new
  // start value written from the host shows in the kernel.
  int seven = 7;
  CHECK(cudaMemcpyToSymbol(start_value, &seven, sizeof(int)));
  poly<<<(n + 127) / 128, 128>>>(dx, dy, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyFromSymbol(&count, counter, sizeof(int)));
  EXPECT(count == 2 * n, "counter %d after two launches, want %d", count, 2 * n);
  int sq[256];
  CHECK(cudaMemcpy(sq, addr, sizeof(sq), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 256; i++)
    EXPECT(sq[i] == i * i + 7, "squares[%d] = %d, want %d", i, sq[i], i * i + 7);
  // An offset copy into the middle of a symbol.
  int fives[4] = {5, 5, 5, 5};
  CHECK(cudaMemcpyToSymbol(squares, fives, sizeof(fives), 100 * sizeof(int)));
  CHECK(cudaMemcpyFromSymbol(sq, squares, sizeof(sq)));
  EXPECT(sq[99] == 99 * 99 + 7 && sq[100] == 5 && sq[103] == 5 && sq[104] == 104 * 104 + 7,
         "an offset copy landed wrong: %d %d %d %d", sq[99], sq[100], sq[103], sq[104]);
  printf("PASS %s %zu-byte table at %p, counter %d\n", TEST_NAME, size, addr, count);
  return 0;
}
