// Events in graphs, as libraries that build graphs by hand (XLA) and
// programs that capture with external events use them: event record and
// wait nodes added by hand, their events read back and changed in the
// graph and in an executable; then a capture in which
// cudaEventRecordWithFlags(cudaEventRecordExternal) and
// cudaStreamWaitEvent(cudaEventWaitExternal) become such nodes. Each
// replay records its events after the work before them: an event never
// recorded before is recorded by the replay, in order, and the kernels'
// sums are checked.
#define TEST_NAME "graph_events"
#include "check.h"

__global__ void add(float a, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a;
}

static cudaGraphNode_t add_node(cudaGraph_t g, const cudaGraphNode_t *deps, size_t ndeps, float a,
                                float *y, int n) {
  void *args[] = {&a, &y, &n};
  cudaKernelNodeParams p = {};
  p.func = (void *)add;
  p.gridDim = dim3((n + 255) / 256);
  p.blockDim = dim3(256);
  p.kernelParams = args;
  cudaGraphNode_t node;
  CHECK(cudaGraphAddKernelNode(&node, g, deps, ndeps, &p));
  return node;
}

static void expect_all(const float *dy, int n, float want, const char *when) {
  float *out = (float *)malloc(n * sizeof(float));
  CHECK(cudaMemcpy(out, dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(out[i] == want, "y[%d] = %f %s, want %f", i, out[i], when, want);
  free(out);
}

// Elapsed time from `a` to `b`, which must both have been recorded and be done.
static float elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  EXPECT(ms >= 0, "%f ms between events recorded in order", ms);
  return ms;
}

int main() {
  const int n = 5000;
  float *dy;
  CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CHECK(cudaMemset(dy, 0, n * sizeof(float)));
  cudaStream_t s, other_stream;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&other_stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1, e2, other;
  for (cudaEvent_t *e : {&e0, &e1, &e2, &other}) CHECK(cudaEventCreate(e));
  CHECK(cudaEventRecord(other, other_stream));

  // By hand: wait(other) -> add 1 -> record(e0) -> add 2 -> record(e1).
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t wait, r0, r1;
  CHECK(cudaGraphAddEventWaitNode(&wait, g, NULL, 0, other));
  cudaGraphNode_t k1 = add_node(g, &wait, 1, 1.0f, dy, n);
  CHECK(cudaGraphAddEventRecordNode(&r0, g, &k1, 1, e0));
  cudaGraphNode_t k2 = add_node(g, &r0, 1, 2.0f, dy, n);
  CHECK(cudaGraphAddEventRecordNode(&r1, g, &k2, 1, e1));
  cudaGraphNodeType t;
  CHECK(cudaGraphNodeGetType(wait, &t));
  EXPECT(t == cudaGraphNodeTypeWaitEvent, "wait node of type %d", (int)t);
  CHECK(cudaGraphNodeGetType(r0, &t));
  EXPECT(t == cudaGraphNodeTypeEventRecord, "record node of type %d", (int)t);
  cudaEvent_t got;
  CHECK(cudaGraphEventRecordNodeGetEvent(r0, &got));
  EXPECT(got == e0, "the record node's event");
  CHECK(cudaGraphEventWaitNodeGetEvent(wait, &got));
  EXPECT(got == other, "the wait node's event");
  EXPECT(cudaGraphEventRecordNodeGetEvent(wait, &got) == cudaErrorInvalidValue,
         "a wait node is not a record node");
  float ms;
  EXPECT(cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess, "e0 and e1 were never recorded");

  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaEventQuery(e0));
  CHECK(cudaEventQuery(e1));
  elapsed(e0, e1);
  expect_all(dy, n, 3.0f, "after one replay");

  // The executable's last record goes to e2 instead; the graph's stays.
  CHECK(cudaGraphExecEventRecordNodeSetEvent(exec, r1, e2));
  EXPECT(cudaEventElapsedTime(&ms, e0, e2) != cudaSuccess, "e2 was never recorded");
  CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  elapsed(e0, e2);
  expect_all(dy, n, 6.0f, "after two replays");
  CHECK(cudaGraphEventRecordNodeGetEvent(r1, &got));
  EXPECT(got == e1, "the graph's node keeps its event");
  CHECK(cudaGraphEventRecordNodeSetEvent(r1, e2));
  CHECK(cudaGraphEventRecordNodeGetEvent(r1, &got));
  EXPECT(got == e2, "the graph's node takes a new event");
  CHECK(cudaGraphEventWaitNodeSetEvent(wait, e1));
  CHECK(cudaGraphExecEventWaitNodeSetEvent(exec, wait, e1));
  CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  expect_all(dy, n, 9.0f, "after three replays");

  // A capture: external records and waits become nodes; a plain record
  // only joins streams, as in CUDA.
  cudaEvent_t start, mid, end;
  for (cudaEvent_t *e : {&start, &mid, &end}) CHECK(cudaEventCreate(e));
  cudaGraph_t cg;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaEventRecordWithFlags(start, s, cudaEventRecordExternal));
  add<<<(n + 255) / 256, 256, 0, s>>>(1.0f, dy, n);
  CHECK(cudaEventRecordWithFlags(mid, s, cudaEventRecordExternal));
  CHECK(cudaStreamWaitEvent(s, other, cudaEventWaitExternal));
  add<<<(n + 255) / 256, 256, 0, s>>>(1.0f, dy, n);
  CHECK(cudaEventRecordWithFlags(end, s, cudaEventRecordExternal));
  CHECK(cudaStreamEndCapture(s, &cg));
  size_t count = 0;
  CHECK(cudaGraphGetNodes(cg, NULL, &count));
  EXPECT(count == 6, "%zu captured nodes, want 6", count);
  cudaGraphNode_t nodes[6];
  CHECK(cudaGraphGetNodes(cg, nodes, &count));
  cudaGraphNodeType want[6] = {cudaGraphNodeTypeEventRecord, cudaGraphNodeTypeKernel,
                               cudaGraphNodeTypeEventRecord, cudaGraphNodeTypeWaitEvent,
                               cudaGraphNodeTypeKernel,      cudaGraphNodeTypeEventRecord};
  for (int i = 0; i < 6; i++) {
    CHECK(cudaGraphNodeGetType(nodes[i], &t));
    EXPECT(t == want[i], "captured node %d of type %d, want %d", i, (int)t, (int)want[i]);
  }
  EXPECT(cudaEventElapsedTime(&ms, start, end) != cudaSuccess, "nothing was recorded while capturing");
  cudaGraphExec_t cexec;
  CHECK(cudaGraphInstantiate(&cexec, cg, 0));
  for (int r = 0; r < 2; r++) CHECK(cudaGraphLaunch(cexec, s));
  CHECK(cudaStreamSynchronize(s));
  float whole = elapsed(start, end), first = elapsed(start, mid), second = elapsed(mid, end);
  EXPECT(first <= whole && second <= whole, "%f + %f ms within %f", first, second, whole);
  expect_all(dy, n, 13.0f, "after the captured graph twice");

  CHECK(cudaGraphExecDestroy(cexec));
  CHECK(cudaGraphDestroy(cg));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  for (cudaEvent_t e : {e0, e1, e2, other, start, mid, end}) CHECK(cudaEventDestroy(e));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(other_stream));
  CHECK(cudaFree(dy));
  printf("PASS %s record and wait nodes by hand and captured, %d replays\n", TEST_NAME, 5);
  return 0;
}
