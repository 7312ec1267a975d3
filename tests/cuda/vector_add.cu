// Vector add through the runtime's usual calls: cudaMalloc, cudaMemcpy,
// a <<<>>> launch, cudaGetLastError, cudaFree.
#define TEST_NAME "vector_add"
#include "check.h"

__global__ void vadd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main() {
  const int n = 100000;  // not a multiple of the block
  size_t sz = n * sizeof(float);
  float *a = (float *)malloc(sz), *b = (float *)malloc(sz), *c = (float *)malloc(sz);
  unsigned s = 1;
  for (int i = 0; i < n; i++) {
    a[i] = (float)(lcg(&s) % 1000);
    b[i] = (float)(lcg(&s) % 1000);
  }
  float *da, *db, *dc;
  CHECK(cudaMalloc(&da, sz));
  CHECK(cudaMalloc(&db, sz));
  CHECK(cudaMalloc(&dc, sz));
  CHECK(cudaMemcpy(da, a, sz, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b, sz, cudaMemcpyHostToDevice));
  vadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(c, dc, sz, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(c[i] == a[i] + b[i], "c[%d] = %f, want %f", i, c[i], a[i] + b[i]);
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dc));
  printf("PASS %s n=%d\n", TEST_NAME, n);
  return 0;
}
