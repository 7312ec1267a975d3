// Streams, events with timing, async copies from pinned memory,
// device-to-device copies and memsets.
#define TEST_NAME "streams"
#include "check.h"

__global__ void scale(float *x, float k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= k;
}

int main() {
  const int n = 1 << 16, parts = 4, per = n / parts;
  size_t sz = n * sizeof(float);
  float *h, *out;
  CHECK(cudaMallocHost(&h, sz));
  CHECK(cudaHostAlloc(&out, sz, cudaHostAllocDefault));
  for (int i = 0; i < n; i++) h[i] = (float)i;
  float *d, *d2;
  CHECK(cudaMalloc(&d, sz));
  CHECK(cudaMalloc(&d2, sz));
  cudaStream_t st[parts];
  for (int p = 0; p < parts; p++) CHECK(cudaStreamCreateWithFlags(&st[p], cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, st[0]));
  for (int p = 0; p < parts; p++) {
    CHECK(cudaMemcpyAsync(d + p * per, h + p * per, per * 4, cudaMemcpyHostToDevice, st[p]));
    scale<<<per / 256, 256, 0, st[p]>>>(d + p * per, (float)(p + 2), per);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(d2 + p * per, d + p * per, per * 4, cudaMemcpyDeviceToDevice, st[p]));
    CHECK(cudaMemcpyAsync(out + p * per, d2 + p * per, per * 4, cudaMemcpyDeviceToHost, st[p]));
  }
  for (int p = 0; p < parts; p++) CHECK(cudaStreamSynchronize(st[p]));
  CHECK(cudaEventRecord(stop, st[0]));
  CHECK(cudaEventSynchronize(stop));
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  EXPECT(ms > 0.0f, "elapsed %f ms", ms);
  for (int i = 0; i < n; i++) EXPECT(out[i] == (float)i * (float)(i / per + 2), "out[%d] = %f", i, out[i]);
  // Memsets of odd sizes and offsets keep the bytes around them.
  unsigned char *b;
  CHECK(cudaMalloc(&b, 64));
  CHECK(cudaMemset(b, 0x11, 64));
  CHECK(cudaMemset(b + 3, 0xab, 29));
  unsigned char hb[64];
  CHECK(cudaMemcpy(hb, b, 64, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 64; i++) EXPECT(hb[i] == ((i >= 3 && i < 32) ? 0xab : 0x11), "byte %d = %#x", i, hb[i]);
  // Unified addressing: cudaMemcpyDefault tells host from device.
  CHECK(cudaMemcpy(hb, b, 64, cudaMemcpyDefault));
  EXPECT(hb[5] == 0xab, "cudaMemcpyDefault read %#x", hb[5]);
  cudaPointerAttributes pa;
  CHECK(cudaPointerGetAttributes(&pa, d));
  EXPECT(pa.type == cudaMemoryTypeDevice, "device pointer has type %d", (int)pa.type);
  for (int p = 0; p < parts; p++) CHECK(cudaStreamDestroy(st[p]));
  CHECK(cudaFreeHost(h));
  CHECK(cudaFreeHost(out));
  printf("PASS %s %d streams, %.3f ms\n", TEST_NAME, parts, ms);
  return 0;
}
