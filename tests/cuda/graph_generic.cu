// Graphs built with the generic node functions of CUDA 12.2 on
// (cudaGraphAddNode, cudaGraphNodeSetParams, cudaGraphExecNodeSetParams):
// a memset, a kernel, a copy to pinned memory, a host function and an
// empty node in a chain; parameters changed in the instantiated graph and
// in the graph; a type mismatch and an unsupported type refused, an
// allocation node made; the
// graph's edges, its nodes found in a clone, and its DOT description;
// kernel node attributes kept, a cluster shape checked against the grid.
#define TEST_NAME "graph_generic"
#include "check.h"
#include <fstream>
#include <sstream>
#include <string>

__global__ void axpb(float *x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
}

static void CUDART_CB count_call(void *p) { ++*(int *)p; }

static void expect_all(const float *h, int n, float want, const char *what) {
  for (int i = 0; i < n; i++) EXPECT(h[i] == want, "%s: element %d is %g, want %g", what, i, h[i], want);
}

int main() {
  const int n = 1000;
  float *d, *h;
  CHECK(cudaMalloc(&d, n * sizeof(float)));
  CHECK(cudaMallocHost(&h, n * sizeof(float)));
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));

  cudaGraphNodeParams ms = {};
  ms.type = cudaGraphNodeTypeMemset;
  ms.memset.dst = d;
  ms.memset.value = 0;
  ms.memset.elementSize = 4;
  ms.memset.width = n;
  ms.memset.height = 1;
  cudaGraphNode_t set, kernel, copy, host, empty;
  CHECK(cudaGraphAddNode(&set, g, nullptr, nullptr, 0, &ms));

  float a = 2, b = 3;
  int count = n;
  void *args[] = {&d, &a, &b, &count};
  cudaGraphNodeParams kp = {};
  kp.type = cudaGraphNodeTypeKernel;
  kp.kernel.func = (void *)axpb;
  kp.kernel.gridDim = dim3((n + 255) / 256);
  kp.kernel.blockDim = dim3(256);
  kp.kernel.kernelParams = args;
  CHECK(cudaGraphAddNode(&kernel, g, &set, nullptr, 1, &kp));

  cudaGraphNodeParams cp = {};
  cp.type = cudaGraphNodeTypeMemcpy;
  cp.memcpy.copyParams.srcPtr = make_cudaPitchedPtr(d, n * sizeof(float), n, 1);
  cp.memcpy.copyParams.dstPtr = make_cudaPitchedPtr(h, n * sizeof(float), n, 1);
  cp.memcpy.copyParams.extent = make_cudaExtent(n * sizeof(float), 1, 1);
  cp.memcpy.copyParams.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaGraphAddNode(&copy, g, &kernel, nullptr, 1, &cp));

  int calls = 0;
  cudaGraphNodeParams hp = {};
  hp.type = cudaGraphNodeTypeHost;
  hp.host.fn = count_call;
  hp.host.userData = &calls;
  CHECK(cudaGraphAddNode(&host, g, &copy, nullptr, 1, &hp));
  cudaGraphNodeParams ep = {};
  ep.type = cudaGraphNodeTypeEmpty;
  CHECK(cudaGraphAddNode(&empty, g, &host, nullptr, 1, &ep));
  cudaGraphNodeType t;
  CHECK(cudaGraphNodeGetType(kernel, &t));
  EXPECT(t == cudaGraphNodeTypeKernel, "the kernel node has type %d", (int)t);

  // Kernel node attributes: a priority kept and read back; a cluster
  // shape that divides the grid (4 blocks) taken, one that does not
  // refused; a cooperative launch not offered. The shape goes back to
  // one block a cluster: the software backend runs blocks alone.
  cudaLaunchAttributeValue v = {}, back = {};
  v.priority = 3;
  CHECK(cudaGraphKernelNodeSetAttribute(kernel, cudaLaunchAttributePriority, &v));
  CHECK(cudaGraphKernelNodeGetAttribute(kernel, cudaLaunchAttributePriority, &back));
  EXPECT(back.priority == 3, "priority read back as %d", back.priority);
  v = {};
  v.clusterDim.x = 2;
  v.clusterDim.y = 1;
  v.clusterDim.z = 1;
  CHECK(cudaGraphKernelNodeSetAttribute(kernel, cudaLaunchAttributeClusterDimension, &v));
  CHECK(cudaGraphKernelNodeGetAttribute(kernel, cudaLaunchAttributeClusterDimension, &back));
  EXPECT(back.clusterDim.x == 2 && back.clusterDim.y == 1, "cluster read back as %u x %u", back.clusterDim.x,
         back.clusterDim.y);
  v.clusterDim.x = 3;
  EXPECT(cudaGraphKernelNodeSetAttribute(kernel, cudaLaunchAttributeClusterDimension, &v) == cudaErrorInvalidValue,
         "clusters of 3 blocks taken for a grid of 4");
  (void)cudaGetLastError();
  v = {};
  v.cooperative = 1;
  EXPECT(cudaGraphKernelNodeSetAttribute(kernel, cudaLaunchAttributeCooperative, &v) != cudaSuccess,
         "a cooperative kernel node taken");
  (void)cudaGetLastError();
  v = {};
  v.clusterDim.x = v.clusterDim.y = v.clusterDim.z = 1;
  CHECK(cudaGraphKernelNodeSetAttribute(kernel, cudaLaunchAttributeClusterDimension, &v));

  // The chain's four edges, in order.
  size_t edges = 0;
  CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
  EXPECT(edges == 4, "%zu edges, want 4", edges);
  cudaGraphNode_t from[6], to[6];
  size_t room = 6;
  CHECK(cudaGraphGetEdges(g, from, to, nullptr, &room));
  cudaGraphNode_t chain[5] = {set, kernel, copy, host, empty};
  EXPECT(room == 4, "%zu edges given, want 4", room);
  for (int i = 0; i < 4; i++)
    EXPECT(from[i] == chain[i] && to[i] == chain[i + 1], "edge %d is not node %d -> %d", i, i, i + 1);
  EXPECT(from[4] == nullptr && to[5] == nullptr, "the room past the edges is not nulled");

  // A clone's nodes are found from the original's; another graph's not.
  cudaGraph_t clone, other;
  CHECK(cudaGraphClone(&clone, g));
  cudaGraphNode_t found;
  CHECK(cudaGraphNodeFindInClone(&found, kernel, clone));
  CHECK(cudaGraphNodeGetType(found, &t));
  EXPECT(t == cudaGraphNodeTypeKernel && found != kernel, "the kernel's clone is of type %d", (int)t);
  CHECK(cudaGraphCreate(&other, 0));
  EXPECT(cudaGraphNodeFindInClone(&found, kernel, other) == cudaErrorInvalidValue,
         "a node found in a graph that is not a clone");
  (void)cudaGetLastError();

  // The graph in DOT: five nodes, four edges.
  const char *dot_path = "/tmp/graph_generic.dot";
  CHECK(cudaGraphDebugDotPrint(g, dot_path, 0));
  std::ifstream in(dot_path);
  std::stringstream text;
  text << in.rdbuf();
  std::string dot = text.str();
  size_t arrows = 0;
  for (size_t at = dot.find("->"); at != std::string::npos; at = dot.find("->", at + 2)) arrows++;
  EXPECT(dot.rfind("digraph", 0) == 0 && arrows == 4 && dot.find("kernel") != std::string::npos,
         "the DOT description: %s", dot.c_str());
  remove(dot_path);

  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaStreamSynchronize(0));
  expect_all(h, n, 3.0f, "first launch");
  EXPECT(calls == 1, "the host node ran %d times", calls);

  // The instantiated graph's kernel takes new arguments: 4 * 0 + 1.
  a = 4;
  b = 1;
  CHECK(cudaGraphExecNodeSetParams(x, kernel, &kp));
  CHECK(cudaGraphLaunch(x, 0));
  CHECK(cudaStreamSynchronize(0));
  expect_all(h, n, 1.0f, "after cudaGraphExecNodeSetParams");
  EXPECT(calls == 2, "the host node ran %d times", calls);

  // The graph's memset now writes 1.0f; a new instance: 2 * 1 + 3.
  ms.memset.value = 0x3f800000;
  CHECK(cudaGraphNodeSetParams(set, &ms));
  cudaGraphExec_t x2;
  CHECK(cudaGraphInstantiate(&x2, g, 0));
  CHECK(cudaGraphLaunch(x2, 0));
  CHECK(cudaStreamSynchronize(0));
  expect_all(h, n, 5.0f, "after cudaGraphNodeSetParams");

  // A kernel node is not given a memset's parameters; an allocation
  // node is made through the generic function too, and gives its address
  // back; an external semaphore node (a vGPU imports none) is refused.
  EXPECT(cudaGraphNodeSetParams(kernel, &ms) == cudaErrorInvalidValue, "a memset's parameters set on a kernel node");
  (void)cudaGetLastError();
  cudaGraph_t mg;
  CHECK(cudaGraphCreate(&mg, 0));
  cudaGraphNodeParams alloc = {};
  alloc.type = cudaGraphNodeTypeMemAlloc;
  alloc.alloc.poolProps.allocType = cudaMemAllocationTypePinned;
  alloc.alloc.poolProps.location.type = cudaMemLocationTypeDevice;
  alloc.alloc.bytesize = 1 << 20;
  cudaGraphNode_t an;
  CHECK(cudaGraphAddNode(&an, mg, nullptr, nullptr, 0, &alloc));
  EXPECT(alloc.alloc.dptr != nullptr, "an allocation node gave no address");
  cudaGraphNodeType at;
  CHECK(cudaGraphNodeGetType(an, &at));
  EXPECT(at == cudaGraphNodeTypeMemAlloc, "an allocation node of type %d", (int)at);
  CHECK(cudaGraphDestroy(mg));
  cudaGraphNodeParams sema = {};
  sema.type = cudaGraphNodeTypeExtSemaphoreSignal;
  EXPECT(cudaGraphAddNode(&an, g, nullptr, nullptr, 0, &sema) != cudaSuccess, "an external semaphore node was taken");
  (void)cudaGetLastError();

  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphExecDestroy(x2));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaGraphDestroy(clone));
  CHECK(cudaGraphDestroy(other));
  CHECK(cudaFreeHost(h));
  CHECK(cudaFree(d));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
