// Host functions in a stream (cudaLaunchHostFunc, cudaStreamAddCallback):
// each runs once the stream's earlier work is done and before its later
// work starts, so it can read what a copy before it brought back and
// write what a copy after it sends.
#define TEST_NAME "host_func"
#include "check.h"

__global__ void add(int *p, int v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

struct Ctx {
  int *host;
  int n;
  int calls;
  int seen;
  cudaError_t status;
};

static void CUDART_CB between(void *arg) {
  Ctx *c = (Ctx *)arg;
  c->calls++;
  c->seen = c->host[c->n - 1];
  // What the next copy sends to the device.
  for (int i = 0; i < c->n; i++) c->host[i] = c->seen * 10;
}

static void CUDART_CB callback(cudaStream_t, cudaError_t status, void *arg) {
  Ctx *c = (Ctx *)arg;
  c->calls++;
  c->status = status;
  c->seen = c->host[0];
}

int main() {
  const int n = 1 << 16;
  int *d, *h;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMallocHost(&h, n * sizeof(int)));
  CHECK(cudaMemset(d, 0, n * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  Ctx c = {h, n, 0, -1, cudaErrorUnknown};
  add<<<n / 256, 256, 0, s>>>(d, 7, n);
  CHECK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaLaunchHostFunc(s, between, &c));
  CHECK(cudaMemcpyAsync(d, h, n * sizeof(int), cudaMemcpyHostToDevice, s));
  add<<<n / 256, 256, 0, s>>>(d, 1, n);
  CHECK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(c.calls == 1, "the host function ran %d times", c.calls);
  EXPECT(c.seen == 7, "the host function saw %d, want 7 (the work before it done)", c.seen);
  for (int i = 0; i < n; i++) EXPECT(h[i] == 71, "h[%d] = %d, want 71", i, h[i]);
  printf("PASS %s launch-host-func\n", TEST_NAME);

  add<<<n / 256, 256, 0, s>>>(d, 1, n);
  CHECK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamAddCallback(s, callback, &c, 0));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(c.calls == 2, "the callback ran %d times in all", c.calls);
  EXPECT(c.status == cudaSuccess, "the callback's status: %s", cudaGetErrorString(c.status));
  EXPECT(c.seen == 72, "the callback saw %d, want 72", c.seen);
  EXPECT(cudaStreamAddCallback(s, callback, &c, 1) != cudaSuccess, "flags 1 were accepted");
  cudaGetLastError();
  printf("PASS %s stream-callback\n", TEST_NAME);

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFreeHost(h));
  CHECK(cudaFree(d));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
