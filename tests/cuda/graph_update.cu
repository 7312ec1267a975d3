// Changing graphs after they are made, as inference engines do between
// steps: a kernel node's parameters read back and set (in the graph, and
// in an executable), and an executable updated from a newly captured
// graph of the same topology; a graph of another topology is refused
// with the node at fault, and the caller instantiates again.
#define TEST_NAME "graph_update"
#include "check.h"

__global__ void add(int *p, int v) { atomicAdd(p, v); }

static cudaGraph_t capture(cudaStream_t s, int *p, const int *values, int n) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < n; i++) add<<<1, 1, 0, s>>>(p, values[i]);
  CHECK(cudaStreamEndCapture(s, &g));
  return g;
}

static int run(cudaGraphExec_t e, cudaStream_t s, int *p) {
  int v = -1;
  CHECK(cudaMemsetAsync(p, 0, sizeof(int), s));
  CHECK(cudaGraphLaunch(e, s));
  CHECK(cudaMemcpyAsync(&v, p, sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  return v;
}

int main() {
  int *p;
  CHECK(cudaMalloc(&p, sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int first[3] = {1, 2, 3};
  cudaGraph_t g = capture(s, p, first, 3);
  cudaGraphExec_t e;
  CHECK(cudaGraphInstantiate(&e, g, 0));
  EXPECT(run(e, s, p) == 6, "first launch");

  // Read a node's parameters back: the kernel, its shape, its argument.
  size_t n = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &n));
  EXPECT(n == 3, "%zu nodes", n);
  cudaGraphNode_t nodes[3];
  CHECK(cudaGraphGetNodes(g, nodes, &n));
  cudaKernelNodeParams kp = {};
  CHECK(cudaGraphKernelNodeGetParams(nodes[1], &kp));
  EXPECT(kp.gridDim.x == 1 && kp.blockDim.x == 1 && kp.sharedMemBytes == 0, "shape");
  EXPECT(*(int **)kp.kernelParams[0] == p, "first argument %p, want %p", *(int **)kp.kernelParams[0], p);
  EXPECT(*(int *)kp.kernelParams[1] == 2, "second argument %d, want 2", *(int *)kp.kernelParams[1]);
  printf("PASS %s get-params\n", TEST_NAME);

  // Set in the executable: that node now adds 100; the graph is unchanged.
  int hundred = 100;
  void *args[2] = {&p, &hundred};
  kp.kernelParams = args;
  CHECK(cudaGraphExecKernelNodeSetParams(e, nodes[1], &kp));
  EXPECT(run(e, s, p) == 104, "after the executable's node changed");
  // Set in the graph: a new instantiation sees it, the old one does not.
  int ten = 10;
  args[1] = &ten;
  CHECK(cudaGraphKernelNodeSetParams(nodes[2], &kp));
  cudaGraphExec_t e2;
  CHECK(cudaGraphInstantiate(&e2, g, 0));
  EXPECT(run(e2, s, p) == 13, "a graph node set to add 10");
  EXPECT(run(e, s, p) == 104, "the executable made before that");
  printf("PASS %s set-params\n", TEST_NAME);

  // Update the first executable from a new capture of the same shape.
  const int second[3] = {1000, 2000, 3000};
  cudaGraph_t g2 = capture(s, p, second, 3);
  cudaGraphExecUpdateResultInfo info = {};
  CHECK(cudaGraphExecUpdate(e, g2, &info));
  EXPECT(info.result == cudaGraphExecUpdateSuccess, "result %d", (int)info.result);
  EXPECT(run(e, s, p) == 6000, "after the update");
  printf("PASS %s exec-update\n", TEST_NAME);

  // Another topology is refused, and the executable keeps its work.
  cudaGraph_t g3 = capture(s, p, first, 2);
  cudaError_t r = cudaGraphExecUpdate(e, g3, &info);
  EXPECT(r == cudaErrorGraphExecUpdateFailure, "update to 2 nodes: %s", cudaGetErrorString(r));
  EXPECT(info.result == cudaGraphExecUpdateErrorTopologyChanged, "result %d", (int)info.result);
  cudaGetLastError();
  EXPECT(run(e, s, p) == 6000, "after a refused update");
  // What engines do then: instantiate again.
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphInstantiate(&e, g3, 0));
  EXPECT(run(e, s, p) == 3, "the new instantiation");
  printf("PASS %s topology-changed\n", TEST_NAME);

  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphExecDestroy(e2));
  CHECK(cudaGraphDestroy(g3));
  CHECK(cudaGraphDestroy(g2));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(p));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
