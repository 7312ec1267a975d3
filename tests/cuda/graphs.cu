// Stream capture and graphs, as torch.cuda.graph uses them: kernels, a
// memset and a device copy captured on one stream, a fork onto a second
// stream and back through events (and onto a third, destroyed once
// joined), then the graph replayed; and a capture broken by a synchronise
// of its stream.
#define TEST_NAME "graphs"
#include "check.h"

__global__ void axpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
  const int n = 5000, replays = 10;  // n not a multiple of the block
  const int blocks = (n + 255) / 256;
  size_t sz = n * sizeof(float);
  float *x = (float *)malloc(sz), *y = (float *)malloc(sz), *out = (float *)malloc(sz);
  float *t = (float *)calloc(n, sizeof(float)), *w = (float *)calloc(n, sizeof(float));
  float *z = (float *)calloc(n, sizeof(float));
  for (int i = 0; i < n; i++) {
    x[i] = (float)(i % 7 + 1);
    y[i] = (float)(i % 5);
  }
  float *dx, *dy, *dt, *dw, *dz;
  CHECK(cudaMalloc(&dx, sz));
  CHECK(cudaMalloc(&dy, sz));
  CHECK(cudaMalloc(&dt, sz));
  CHECK(cudaMalloc(&dw, sz));
  CHECK(cudaMalloc(&dz, sz));
  CHECK(cudaMemcpy(dx, x, sz, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dy, y, sz, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dt, 0, sz));
  CHECK(cudaMemset(dw, 0, sz));
  CHECK(cudaMemset(dz, 0, sz));
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  // The capture: y = 2x + y; t = 0; t = 0.5y + t; on s2, w = 3x + w;
  // back on s1, z = t; z = w + z.
  cudaStreamCaptureStatus st;
  CHECK(cudaStreamIsCapturing(s1, &st));
  EXPECT(st == cudaStreamCaptureStatusNone, "status %d before the capture", (int)st);
  CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  CHECK(cudaStreamIsCapturing(s1, &st));
  EXPECT(st == cudaStreamCaptureStatusActive, "status %d in the capture", (int)st);
  unsigned long long id = 0;
  CHECK(cudaStreamGetCaptureInfo(s1, &st, &id));
  EXPECT(st == cudaStreamCaptureStatusActive && id != 0, "status %d, id %llu", (int)st, id);
  axpy<<<blocks, 256, 0, s1>>>(2.0f, dx, dy, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemsetAsync(dt, 0, sz, s1));
  axpy<<<blocks, 256, 0, s1>>>(0.5f, dy, dt, n);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(fork, s1));
  CHECK(cudaStreamWaitEvent(s2, fork, 0));
  CHECK(cudaStreamIsCapturing(s2, &st));
  EXPECT(st == cudaStreamCaptureStatusActive, "status %d of the joined stream", (int)st);
  axpy<<<blocks, 256, 0, s2>>>(3.0f, dx, dw, n);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(join, s2));
  CHECK(cudaStreamWaitEvent(s1, join, 0));
  // A third stream forked and joined back, then destroyed before the
  // capture ends: its work stays in the graph, as on a GPU.
  cudaStream_t s3;
  cudaEvent_t fork3, join3;
  CHECK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
  CHECK(cudaEventCreateWithFlags(&fork3, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join3, cudaEventDisableTiming));
  CHECK(cudaEventRecord(fork3, s1));
  CHECK(cudaStreamWaitEvent(s3, fork3, 0));
  axpy<<<blocks, 256, 0, s3>>>(1.0f, dx, dw, n);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(join3, s3));
  CHECK(cudaStreamWaitEvent(s1, join3, 0));
  CHECK(cudaStreamDestroy(s3));
  CHECK(cudaEventDestroy(fork3));
  CHECK(cudaEventDestroy(join3));
  CHECK(cudaMemcpyAsync(dz, dt, sz, cudaMemcpyDeviceToDevice, s1));
  axpy<<<blocks, 256, 0, s1>>>(1.0f, dw, dz, n);
  CHECK(cudaGetLastError());
  cudaGraph_t g = NULL;
  CHECK(cudaStreamEndCapture(s1, &g));
  EXPECT(g != NULL, "no graph");
  CHECK(cudaStreamIsCapturing(s2, &st));
  EXPECT(st == cudaStreamCaptureStatusNone, "status %d of s2 after the capture", (int)st);

  // Nothing ran while capturing.
  CHECK(cudaMemcpy(out, dy, sz, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(out[i] == y[i], "y[%d] = %f after the capture, want %f", i, out[i], y[i]);
  CHECK(cudaMemcpy(out, dz, sz, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(out[i] == 0.0f, "z[%d] = %f after the capture", i, out[i]);

  size_t nodes = 0;
  CHECK(cudaGraphGetNodes(g, NULL, &nodes));
  EXPECT(nodes > 0, "the graph has no nodes");
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  for (int r = 0; r < replays; r++) CHECK(cudaGraphLaunch(exec, s1));
  CHECK(cudaStreamSynchronize(s1));
  for (int r = 0; r < replays; r++) {
    for (int i = 0; i < n; i++) {
      y[i] = 2.0f * x[i] + y[i];
      t[i] = 0.5f * y[i];
      w[i] = 3.0f * x[i] + w[i];
      w[i] = 1.0f * x[i] + w[i];
      z[i] = w[i] + t[i];
    }
  }
  const char *names[] = {"y", "t", "w", "z"};
  float *dev[] = {dy, dt, dw, dz}, *want[] = {y, t, w, z};
  for (int b = 0; b < 4; b++) {
    CHECK(cudaMemcpy(out, dev[b], sz, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
      EXPECT(out[i] == want[b][i], "%s[%d] = %f after %d replays, want %f", names[b], i, out[i], replays,
             want[b][i]);
  }

  // Waiting for a stream that is being captured is not allowed: it
  // fails, and the capture ends invalidated, with no graph.
  CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  cudaError_t e = cudaStreamSynchronize(s1);
  EXPECT(e == cudaErrorStreamCaptureUnsupported, "synchronising in a capture: %s", cudaGetErrorString(e));
  CHECK(cudaStreamIsCapturing(s1, &st));
  EXPECT(st == cudaStreamCaptureStatusInvalidated, "status %d after the synchronise", (int)st);
  cudaGraph_t g2 = (cudaGraph_t)1;
  e = cudaStreamEndCapture(s1, &g2);
  EXPECT(e == cudaErrorStreamCaptureInvalidated, "ending the broken capture: %s", cudaGetErrorString(e));
  EXPECT(g2 == NULL, "the broken capture gave a graph");
  (void)cudaGetLastError();
  // The stream works normally afterwards.
  axpy<<<blocks, 256, 0, s1>>>(1.0f, dx, dy, n);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(s1));

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(fork));
  CHECK(cudaEventDestroy(join));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  float *bufs[] = {dx, dy, dt, dw, dz};
  for (float *p : bufs) CHECK(cudaFree(p));
  printf("PASS %s %zu nodes, %d replays\n", TEST_NAME, nodes, replays);
  return 0;
}
