// A graph built node by node, as XLA and CUDA's graph samples build
// them: memset, kernel, device-to-device memcpy and empty nodes, one
// dependency added after its nodes (so the order they were added in is
// not an order the graph may run in), removed and added again, the nodes
// and their edges listed and typed, then the graph replayed and checked
// against the CPU; then
// the graph cloned, and run again as a child graph node of another.
#define TEST_NAME "graph_nodes"
#include "check.h"

__global__ void axpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

static cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t *deps, size_t ndeps, float a,
                                   const float *x, float *y, int n) {
  void *args[] = {&a, &x, &y, &n};
  cudaKernelNodeParams p = {};
  p.func = (void *)axpy;
  p.gridDim = dim3((n + 255) / 256);
  p.blockDim = dim3(256);
  p.kernelParams = args;
  cudaGraphNode_t node;
  CHECK(cudaGraphAddKernelNode(&node, g, deps, ndeps, &p));
  return node;
}

int main() {
  const int n = 3000, replays = 3;  // n not a multiple of the block
  size_t sz = n * sizeof(float);
  float *x = (float *)malloc(sz), *out = (float *)malloc(sz);
  for (int i = 0; i < n; i++) x[i] = (float)(i % 9 + 1);
  float *dx, *dy, *dw, *dz;
  CHECK(cudaMalloc(&dx, sz));
  CHECK(cudaMalloc(&dy, sz));
  CHECK(cudaMalloc(&dw, sz));
  CHECK(cudaMalloc(&dz, sz));
  CHECK(cudaMemcpy(dx, x, sz, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dw, 0, sz));

  // Each replay: y = 0; y = x + y; z = y; w = 3x + w; z = w + z; then an
  // empty node joins. The last axpy is added before the one computing w,
  // and made to wait for it afterwards.
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaMemsetParams m = {};
  m.dst = dy;
  m.value = 0;
  m.elementSize = 4;
  m.width = n;
  m.height = 1;
  cudaGraphNode_t zero_y;
  CHECK(cudaGraphAddMemsetNode(&zero_y, g, NULL, 0, &m));
  cudaGraphNode_t add_x = kernel_node(g, &zero_y, 1, 1.0f, dx, dy, n);
  cudaGraphNode_t copy;
  CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &add_x, 1, dz, dy, sz, cudaMemcpyDeviceToDevice));
  cudaGraphNode_t add_w = kernel_node(g, &copy, 1, 1.0f, dw, dz, n);
  cudaGraphNode_t make_w = kernel_node(g, NULL, 0, 3.0f, dx, dw, n);
  CHECK(cudaGraphAddDependencies(g, &make_w, &add_w, NULL, 1));
  cudaGraphNode_t join;
  CHECK(cudaGraphAddEmptyNode(&join, g, &add_w, 1));

  size_t count = 0;
  CHECK(cudaGraphGetNodes(g, NULL, &count));
  EXPECT(count == 6, "%zu nodes, want 6", count);
  cudaGraphNode_t nodes[8];
  count = 8;
  CHECK(cudaGraphGetNodes(g, nodes, &count));
  EXPECT(count == 6 && nodes[0] == zero_y && nodes[5] == join, "%zu nodes listed", count);
  size_t roots = 0;
  CHECK(cudaGraphGetRootNodes(g, NULL, &roots));
  EXPECT(roots == 2, "%zu root nodes, want 2 (the memset and the first axpy of w)", roots);
  cudaGraphNodeType types[6];
  cudaGraphNodeType want[6] = {cudaGraphNodeTypeMemset, cudaGraphNodeTypeKernel, cudaGraphNodeTypeMemcpy,
                               cudaGraphNodeTypeKernel, cudaGraphNodeTypeKernel, cudaGraphNodeTypeEmpty};
  for (int i = 0; i < 6; i++) {
    CHECK(cudaGraphNodeGetType(nodes[i], &types[i]));
    EXPECT(types[i] == want[i], "node %d of type %d, want %d", i, (int)types[i], (int)want[i]);
  }
  cudaGraphNode_t deps[4];
  size_t ndeps = 4;
  CHECK(cudaGraphNodeGetDependencies(add_w, deps, NULL, &ndeps));
  EXPECT(ndeps == 2 && deps[0] == copy && deps[1] == make_w, "%zu dependencies of the last axpy", ndeps);
  ndeps = 4;
  CHECK(cudaGraphNodeGetDependentNodes(zero_y, deps, NULL, &ndeps));
  EXPECT(ndeps == 1 && deps[0] == add_x, "%zu nodes depend on the memset", ndeps);
  // A dependency that is there already is refused.
  cudaError_t e = cudaGraphAddDependencies(g, &make_w, &add_w, NULL, 1);
  EXPECT(e == cudaErrorInvalidValue, "the same dependency twice: %s", cudaGetErrorString(e));
  (void)cudaGetLastError();
  // A dependency removed goes; one that is not there is refused; put
  // back, the graph is as before.
  CHECK(cudaGraphRemoveDependencies(g, &make_w, &add_w, NULL, 1));
  ndeps = 4;
  CHECK(cudaGraphNodeGetDependencies(add_w, deps, NULL, &ndeps));
  EXPECT(ndeps == 1 && deps[0] == copy, "%zu dependencies after one was removed", ndeps);
  e = cudaGraphRemoveDependencies(g, &make_w, &add_w, NULL, 1);
  EXPECT(e == cudaErrorInvalidValue, "removing a dependency twice: %s", cudaGetErrorString(e));
  (void)cudaGetLastError();
  CHECK(cudaGraphAddDependencies(g, &make_w, &add_w, NULL, 1));

  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int r = 0; r < replays; r++) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));

  // After r replays w = 3r x, and z = y + w = x + 3r x.
  CHECK(cudaMemcpy(out, dw, sz, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++)
    EXPECT(out[i] == 3.0f * replays * x[i], "w[%d] = %f, want %f", i, out[i], 3.0f * replays * x[i]);
  CHECK(cudaMemcpy(out, dz, sz, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) {
    float z = x[i] + 3.0f * replays * x[i];
    EXPECT(out[i] == z, "z[%d] = %f, want %f", i, out[i], z);
  }

  // A clone has the same nodes; a graph holding the original as a child
  // node, then one more axpy (z = x + z), runs its work once more.
  cudaGraph_t clone, outer;
  CHECK(cudaGraphClone(&clone, g));
  size_t cloned = 0;
  CHECK(cudaGraphGetNodes(clone, NULL, &cloned));
  EXPECT(cloned == 6, "the clone has %zu nodes", cloned);
  CHECK(cudaGraphCreate(&outer, 0));
  cudaGraphNode_t child;
  CHECK(cudaGraphAddChildGraphNode(&child, outer, NULL, 0, g));
  cudaGraphNodeType t;
  CHECK(cudaGraphNodeGetType(child, &t));
  EXPECT(t == cudaGraphNodeTypeGraph, "child node of type %d", (int)t);
  kernel_node(outer, &child, 1, 1.0f, dx, dz, n);
  cudaGraphExec_t outer_exec;
  CHECK(cudaGraphInstantiate(&outer_exec, outer, 0));
  CHECK(cudaGraphLaunch(outer_exec, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(out, dz, sz, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) {
    float z = x[i] + 3.0f * (replays + 1) * x[i] + x[i];
    EXPECT(out[i] == z, "z[%d] = %f after the outer graph, want %f", i, out[i], z);
  }
  CHECK(cudaGraphExecDestroy(outer_exec));
  CHECK(cudaGraphDestroy(outer));
  CHECK(cudaGraphDestroy(clone));

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(s));
  float *bufs[] = {dx, dy, dw, dz};
  for (float *p : bufs) CHECK(cudaFree(p));
  printf("PASS %s %zu nodes, %d replays\n", TEST_NAME, count, replays);
  return 0;
}
