// The orders CUDA keeps between streams, which hold wherever the
// streams' work runs side by side: an event waited for on another
// stream, the legacy default stream after (and before) blocking streams,
// many streams at once, and queries.
#define TEST_NAME "streams_order"
#include "check.h"

// Slow on purpose (a loop per element), so that work queued after it on
// another stream would overtake it were the order not kept.
__global__ void fill_slow(int *x, int v, int n, int rounds) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    int acc = 0;
    for (int r = 0; r < rounds; r++) acc += (r ^ i) & 1;
    x[i] = v + (acc & 0);
  }
}

__global__ void add_from(int *out, const int *in, int k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + k;
}

static void expect_all(const int *d, int n, int want, const char *what) {
  int *h = (int *)malloc(n * sizeof(int));
  CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(h[i] == want, "%s: [%d] = %d, expected %d", what, i, h[i], want);
  free(h);
}

int main() {
  const int n = 1 << 12, threads = 256, blocks = n / threads, rounds = 64;
  int *a, *b, *c;
  CHECK(cudaMalloc(&a, n * sizeof(int)));
  CHECK(cudaMalloc(&b, n * sizeof(int)));
  CHECK(cudaMalloc(&c, n * sizeof(int)));
  cudaStream_t s1, s2, nb1, nb2;
  CHECK(cudaStreamCreate(&s1));
  CHECK(cudaStreamCreate(&s2));
  CHECK(cudaStreamCreateWithFlags(&nb1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&nb2, cudaStreamNonBlocking));
  cudaEvent_t e;
  CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  // 1. An event recorded on one non-blocking stream, waited for on
  // another: the reader sees the writer's values.
  for (int round = 1; round <= 3; round++) {
    fill_slow<<<blocks, threads, 0, nb1>>>(a, 100 * round, n, rounds);
    CHECK(cudaEventRecord(e, nb1));
    CHECK(cudaStreamWaitEvent(nb2, e, 0));
    add_from<<<blocks, threads, 0, nb2>>>(b, a, 1, n);
  }
  CHECK(cudaStreamSynchronize(nb2));
  expect_all(b, n, 301, "event wait across streams");
  CHECK(cudaStreamSynchronize(nb1));

  // 2. The legacy default stream waits for blocking streams' work queued
  // before it, and blocking streams wait for its work.
  fill_slow<<<blocks, threads, 0, s1>>>(a, 7, n, rounds);
  add_from<<<blocks, threads>>>(b, a, 10, n);  // legacy stream: a is 7
  add_from<<<blocks, threads, 0, s2>>>(c, b, 100, n);  // after the legacy work
  CHECK(cudaStreamSynchronize(s2));
  expect_all(c, n, 117, "legacy stream between blocking streams");

  // 3. A synchronous copy is on the legacy stream too.
  fill_slow<<<blocks, threads, 0, s2>>>(c, 42, n, rounds);
  expect_all(c, n, 42, "synchronous copy after a blocking stream");

  // 4. Many streams, each its own chain, none disturbing the others.
  const int m = 8;
  cudaStream_t many[m];
  int *bufs[m];
  for (int k = 0; k < m; k++) {
    CHECK(cudaStreamCreateWithFlags(&many[k], cudaStreamNonBlocking));
    CHECK(cudaMalloc(&bufs[k], n * sizeof(int)));
  }
  for (int step = 0; step < 4; step++)
    for (int k = 0; k < m; k++) {
      if (step == 0)
        fill_slow<<<blocks, threads, 0, many[k]>>>(bufs[k], k * 1000, n, rounds);
      else
        add_from<<<blocks, threads, 0, many[k]>>>(bufs[k], bufs[k], step, n);
    }
  for (int k = 0; k < m; k++) CHECK(cudaStreamSynchronize(many[k]));
  for (int k = 0; k < m; k++) expect_all(bufs[k], n, k * 1000 + 1 + 2 + 3, "stream chain");

  // 5. Queries: a synchronised stream and a completed event are ready.
  CHECK(cudaEventRecord(e, many[3]));
  CHECK(cudaEventSynchronize(e));
  CHECK(cudaEventQuery(e));
  CHECK(cudaStreamQuery(many[3]));
  CHECK(cudaDeviceSynchronize());
  for (int k = 0; k < m; k++) {
    CHECK(cudaStreamQuery(many[k]));
    CHECK(cudaStreamDestroy(many[k]));
    CHECK(cudaFree(bufs[k]));
  }
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaStreamDestroy(nb1));
  CHECK(cudaStreamDestroy(nb2));
  CHECK(cudaEventDestroy(e));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
