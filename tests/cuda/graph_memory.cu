// Graph memory nodes, as the CUDA programming guide's "Graph Memory
// Nodes" describes them: an allocation node's address is fixed when the
// node is made; a kernel writes into it and a copy reads it back before a
// free node frees it, launch after launch; an allocation the graph does
// not free outlives the launch, which is refused again until the
// program frees it, unless the executable frees it on launch; the graph
// memory attributes count what allocation nodes hold and use; memory a
// stream capture allocates and frees (cudaMallocAsync, cudaFreeAsync)
// replays too. Then a graph edited: a node removed, a node disabled and
// enabled in an executable, a child graph node given another graph; and
// copies to and from pageable host memory in graphs, as nodes and
// captured.
// Results are checked against the CPU.
#define TEST_NAME "graph_memory"
#include "check.h"

__global__ void fill_scaled(int *out, int n, int scale, int bias) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * scale + bias;
}

__global__ void add_into(int *dst, const int *src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

static cudaGraphNode_t kernel(cudaGraph_t g, const cudaGraphNode_t *deps, size_t ndeps, void *f,
                              void **args, int n) {
  cudaKernelNodeParams p = {};
  p.func = f;
  p.gridDim = dim3((n + 127) / 128);
  p.blockDim = dim3(128);
  p.kernelParams = args;
  cudaGraphNode_t node;
  CHECK(cudaGraphAddKernelNode(&node, g, deps, ndeps, &p));
  return node;
}

static cudaGraphNode_t alloc_node(cudaGraph_t g, const cudaGraphNode_t *deps, size_t ndeps,
                                  size_t bytes, int dev, void **dptr) {
  cudaMemAllocNodeParams p = {};
  p.poolProps.allocType = cudaMemAllocationTypePinned;
  p.poolProps.location.type = cudaMemLocationTypeDevice;
  p.poolProps.location.id = dev;
  p.bytesize = bytes;
  cudaGraphNode_t node;
  CHECK(cudaGraphAddMemAllocNode(&node, g, deps, ndeps, &p));
  EXPECT(p.dptr != NULL, "an allocation node without an address");
  *dptr = p.dptr;
  return node;
}

static unsigned long long attr(int dev, cudaGraphMemAttributeType a) {
  unsigned long long v = ~0ull;
  CHECK(cudaDeviceGetGraphMemAttribute(dev, a, &v));
  return v;
}

int main() {
  const int n = 1000;
  const size_t bytes = n * sizeof(int);
  int dev = 0;
  CHECK(cudaSetDevice(dev));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int *host = (int *)malloc(bytes), *dout;
  CHECK(cudaMalloc(&dout, bytes));
  unsigned long long reserved0 = attr(dev, cudaGraphMemAttrReservedMemCurrent);

  // 1. Allocated and freed in one graph: out = (i * scale + 1) + i.
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  int *tmp, *tmp2;
  cudaGraphNode_t a1 = alloc_node(g, NULL, 0, bytes, dev, (void **)&tmp);
  cudaGraphNode_t a2 = alloc_node(g, NULL, 0, bytes, dev, (void **)&tmp2);
  EXPECT(tmp != tmp2, "two allocation nodes share an address");
  int scale = 3, one = 1, zero = 0, count = n;
  void *fill1[] = {&tmp, &count, &scale, &one};
  cudaGraphNode_t k1 = kernel(g, &a1, 1, (void *)fill_scaled, fill1, n);
  int unit = 1;
  void *fill2[] = {&tmp2, &count, &unit, &zero};
  cudaGraphNode_t k2 = kernel(g, &a2, 1, (void *)fill_scaled, fill2, n);
  cudaGraphNode_t both[] = {k1, k2};
  void *add[] = {&tmp, &tmp2, &count};
  cudaGraphNode_t k3 = kernel(g, both, 2, (void *)add_into, add, n);
  cudaGraphNode_t copy;
  CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &k3, 1, dout, tmp, bytes, cudaMemcpyDeviceToDevice));
  cudaGraphNode_t f1, f2;
  CHECK(cudaGraphAddMemFreeNode(&f1, g, &copy, 1, tmp));
  CHECK(cudaGraphAddMemFreeNode(&f2, g, &copy, 1, tmp2));
  cudaGraphNode_t again;
  EXPECT(cudaGraphAddMemFreeNode(&again, g, &copy, 1, tmp) == cudaErrorInvalidValue,
         "an allocation freed twice in one graph");
  (void)cudaGetLastError();
  cudaGraphNodeType t;
  CHECK(cudaGraphNodeGetType(a1, &t));
  EXPECT(t == cudaGraphNodeTypeMemAlloc, "allocation node of type %d", (int)t);
  CHECK(cudaGraphNodeGetType(f1, &t));
  EXPECT(t == cudaGraphNodeTypeMemFree, "free node of type %d", (int)t);
  cudaMemAllocNodeParams got = {};
  CHECK(cudaGraphMemAllocNodeGetParams(a1, &got));
  EXPECT(got.dptr == tmp && got.bytesize == bytes, "allocation node parameters read back wrong");
  void *freed = NULL;
  CHECK(cudaGraphMemFreeNodeGetParams(f2, &freed));
  EXPECT(freed == tmp2, "free node parameters read back wrong");
  cudaGraph_t copy_of;
  EXPECT(cudaGraphClone(&copy_of, g) != cudaSuccess, "a graph with memory nodes cloned");
  (void)cudaGetLastError();

  cudaGraphExec_t e;
  CHECK(cudaGraphInstantiate(&e, g, 0));
  for (int rep = 0; rep < 3; rep++) {
    CHECK(cudaMemsetAsync(dout, 0, bytes, s));
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(host, dout, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
      EXPECT(host[i] == i * 3 + 1 + i, "launch %d: out[%d] = %d, want %d", rep, i, host[i],
             i * 3 + 1 + i);
  }
  // Launched, the graph holds the memory of its two allocations
  // (NVIDIA's driver reserves it by then, not when the nodes are made).
  EXPECT(attr(dev, cudaGraphMemAttrReservedMemCurrent) >= reserved0 + 2 * bytes,
         "reserved graph memory %llu below what two nodes hold",
         attr(dev, cudaGraphMemAttrReservedMemCurrent));
  // Freed in the graph: nothing is left in use.
  EXPECT(attr(dev, cudaGraphMemAttrUsedMemCurrent) == 0, "%llu bytes still in use",
         attr(dev, cudaGraphMemAttrUsedMemCurrent));
  EXPECT(attr(dev, cudaGraphMemAttrUsedMemHigh) >= 2 * bytes, "used high mark %llu",
         attr(dev, cudaGraphMemAttrUsedMemHigh));
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaDeviceGraphMemTrim(dev));

  // 2. An allocation the graph leaves to the program: used by a copy
  // after the launch, and freed by the program before the next launch.
  cudaGraph_t h;
  CHECK(cudaGraphCreate(&h, 0));
  int *kept;
  cudaGraphNode_t ak = alloc_node(h, NULL, 0, bytes, dev, (void **)&kept);
  int seven = 7;
  void *fillk[] = {&kept, &count, &seven, &seven};
  kernel(h, &ak, 1, (void *)fill_scaled, fillk, n);
  cudaGraphExec_t eh;
  CHECK(cudaGraphInstantiate(&eh, h, 0));
  cudaGraphExec_t second;
  EXPECT(cudaGraphInstantiate(&second, h, 0) != cudaSuccess,
         "a graph with memory nodes instantiated twice");
  (void)cudaGetLastError();
  for (int rep = 0; rep < 2; rep++) {
    CHECK(cudaGraphLaunch(eh, s));
    CHECK(cudaMemcpyAsync(host, kept, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++)
      EXPECT(host[i] == i * 7 + 7, "kept[%d] = %d after launch %d", i, host[i], rep);
    EXPECT(attr(dev, cudaGraphMemAttrUsedMemCurrent) >= bytes, "the kept allocation not in use");
    EXPECT(cudaGraphLaunch(eh, s) == cudaErrorInvalidValue,
           "a relaunch before the allocation was freed");
    (void)cudaGetLastError();
    CHECK(cudaFreeAsync(kept, s));
    CHECK(cudaStreamSynchronize(s));
  }
  EXPECT(cudaFree(kept) == cudaErrorInvalidValue, "a graph allocation freed twice");
  (void)cudaGetLastError();
  CHECK(cudaGraphExecDestroy(eh));

  // 3. The same graph with automatic frees: relaunched at once.
  CHECK(cudaGraphInstantiateWithFlags(&eh, h, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  unsigned long long flags = 0;
  CHECK(cudaGraphExecGetFlags(eh, &flags));
  EXPECT(flags == cudaGraphInstantiateFlagAutoFreeOnLaunch, "flags %llu", flags);
  for (int rep = 0; rep < 3; rep++) CHECK(cudaGraphLaunch(eh, s));
  CHECK(cudaMemcpyAsync(host, kept, bytes, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; i++) EXPECT(host[i] == i * 7 + 7, "auto-freed kept[%d] = %d", i, host[i]);
  // Destroyed while its allocation is allocated: it stays until freed.
  CHECK(cudaGraphExecDestroy(eh));
  CHECK(cudaGraphDestroy(h));
  CHECK(cudaMemcpy(host, kept, bytes, cudaMemcpyDeviceToHost));
  EXPECT(host[n - 1] == (n - 1) * 7 + 7, "an allocation outlived by its graph lost its data");
  CHECK(cudaFree(kept));
  CHECK(cudaDeviceGraphMemTrim(dev));
  EXPECT(attr(dev, cudaGraphMemAttrReservedMemCurrent) == reserved0,
         "graph memory still held: %llu bytes", attr(dev, cudaGraphMemAttrReservedMemCurrent));
  unsigned long long z = 0;
  CHECK(cudaDeviceSetGraphMemAttribute(dev, cudaGraphMemAttrUsedMemHigh, &z));
  EXPECT(attr(dev, cudaGraphMemAttrUsedMemHigh) == 0, "used high mark not reset");

  // 4. Captured: memory allocated and freed in the stream's capture.
  cudaGraph_t c;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  int *cap;
  CHECK(cudaMallocAsync((void **)&cap, bytes, s));
  int five = 5, two = 2;
  fill_scaled<<<(n + 127) / 128, 128, 0, s>>>(cap, n, five, two);
  CHECK(cudaMemcpyAsync(dout, cap, bytes, cudaMemcpyDeviceToDevice, s));
  CHECK(cudaFreeAsync(cap, s));
  CHECK(cudaStreamEndCapture(s, &c));
  cudaGraphExec_t ec;
  CHECK(cudaGraphInstantiate(&ec, c, 0));
  for (int rep = 0; rep < 2; rep++) {
    CHECK(cudaMemsetAsync(dout, 0, bytes, s));
    CHECK(cudaGraphLaunch(ec, s));
    CHECK(cudaMemcpyAsync(host, dout, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++)
      EXPECT(host[i] == i * 5 + 2, "captured launch %d: out[%d] = %d", rep, i, host[i]);
  }
  CHECK(cudaGraphExecDestroy(ec));
  CHECK(cudaGraphDestroy(c));

  // 5. Editing: a node removed with its edges, a node disabled in an
  // executable and enabled again, and a child graph node given another
  // graph of the same topology.
  int *dsrc;
  CHECK(cudaMalloc(&dsrc, bytes));
  fill_scaled<<<(n + 127) / 128, 128, 0, s>>>(dsrc, n, 1, 0);
  CHECK(cudaStreamSynchronize(s));
  int c2 = 2, c3 = 3, c4 = 4;
  void *fc[] = {&dout, &count, &c2, &one};
  void *fc2[] = {&dout, &count, &c3, &c4};
  cudaGraph_t child, child2, other, parent;
  CHECK(cudaGraphCreate(&child, 0));
  kernel(child, NULL, 0, (void *)fill_scaled, fc, n);
  CHECK(cudaGraphCreate(&child2, 0));
  kernel(child2, NULL, 0, (void *)fill_scaled, fc2, n);
  CHECK(cudaGraphCreate(&other, 0));
  cudaGraphNode_t o1 = kernel(other, NULL, 0, (void *)fill_scaled, fc2, n);
  kernel(other, &o1, 1, (void *)fill_scaled, fc2, n);
  CHECK(cudaGraphCreate(&parent, 0));
  cudaGraphNode_t cn;
  CHECK(cudaGraphAddChildGraphNode(&cn, parent, NULL, 0, child));
  void *addp[] = {&dout, &dsrc, &count};
  cudaGraphNode_t addn = kernel(parent, &cn, 1, (void *)add_into, addp, n);
  cudaMemsetParams zero_out = {};
  zero_out.dst = dout;
  zero_out.elementSize = 4;
  zero_out.width = n;
  zero_out.height = 1;
  cudaGraphNode_t zn;
  CHECK(cudaGraphAddMemsetNode(&zn, parent, &addn, 1, &zero_out));
  CHECK(cudaGraphDestroyNode(zn));
  size_t count_nodes = 0;
  CHECK(cudaGraphGetNodes(parent, NULL, &count_nodes));
  EXPECT(count_nodes == 2, "%zu nodes after one of three was removed", count_nodes);
  cudaGraphExec_t ep;
  CHECK(cudaGraphInstantiate(&ep, parent, 0));
  struct Step {
    const char *what;
    int scale, bias;
    bool add;
  };
  for (int step = 0; step < 4; step++) {
    Step st[] = {{"as built", 2, 1, true},
                 {"its add disabled", 2, 1, false},
                 {"its add enabled", 2, 1, true},
                 {"the child replaced", 3, 4, true}};
    if (step == 1) CHECK(cudaGraphNodeSetEnabled(ep, addn, 0));
    if (step == 2) CHECK(cudaGraphNodeSetEnabled(ep, addn, 1));
    if (step == 3) CHECK(cudaGraphExecChildGraphNodeSetParams(ep, cn, child2));
    unsigned enabled = 7;
    CHECK(cudaGraphNodeGetEnabled(ep, addn, &enabled));
    EXPECT(enabled == (st[step].add ? 1u : 0u), "%s: enabled reads %u", st[step].what, enabled);
    CHECK(cudaGraphLaunch(ep, s));
    CHECK(cudaMemcpyAsync(host, dout, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) {
      int want = i * st[step].scale + st[step].bias + (st[step].add ? i : 0);
      EXPECT(host[i] == want, "%s: out[%d] = %d, want %d", st[step].what, i, host[i], want);
    }
  }
  EXPECT(cudaGraphExecChildGraphNodeSetParams(ep, cn, other) != cudaSuccess,
         "a child graph of another topology taken");
  (void)cudaGetLastError();
  CHECK(cudaGraphExecDestroy(ep));
  CHECK(cudaGraphDestroy(parent));
  CHECK(cudaGraphDestroy(other));
  CHECK(cudaGraphDestroy(child2));
  CHECK(cudaGraphDestroy(child));
  CHECK(cudaFree(dsrc));

  // 6. Pageable host memory (malloc'd): memcpy nodes to and from it, and
  // the same copies captured from cudaMemcpyAsync; each launch reads the
  // input as it is then and writes the output.
  int *pin = (int *)malloc(bytes), *pout = (int *)malloc(bytes);
  void *twice[] = {&dout, &dout, &count};
  cudaGraph_t pg;
  CHECK(cudaGraphCreate(&pg, 0));
  cudaGraphNode_t up, dn;
  CHECK(cudaGraphAddMemcpyNode1D(&up, pg, NULL, 0, dout, pin, bytes, cudaMemcpyHostToDevice));
  cudaGraphNode_t kt = kernel(pg, &up, 1, (void *)add_into, twice, n);
  CHECK(cudaGraphAddMemcpyNode1D(&dn, pg, &kt, 1, pout, dout, bytes, cudaMemcpyDeviceToHost));
  cudaGraph_t cg;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpyAsync(dout, pin, bytes, cudaMemcpyHostToDevice, s));
  add_into<<<(n + 127) / 128, 128, 0, s>>>(dout, dout, n);
  CHECK(cudaMemcpyAsync(pout, dout, bytes, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamEndCapture(s, &cg));
  cudaGraph_t which[] = {pg, cg};
  for (int w = 0; w < 2; w++) {
    cudaGraphExec_t ex;
    CHECK(cudaGraphInstantiate(&ex, which[w], 0));
    for (int rep = 0; rep < 2; rep++) {
      for (int i = 0; i < n; i++) {
        pin[i] = i * 11 - 5 + rep * 1000 + w;
        pout[i] = -1;
      }
      CHECK(cudaGraphLaunch(ex, s));
      CHECK(cudaStreamSynchronize(s));
      for (int i = 0; i < n; i++)
        EXPECT(pout[i] == 2 * pin[i], "pageable %s launch %d: out[%d] = %d, want %d",
               w ? "captured" : "node", rep, i, pout[i], 2 * pin[i]);
    }
    CHECK(cudaGraphExecDestroy(ex));
    CHECK(cudaGraphDestroy(which[w]));
  }
  free(pin);
  free(pout);

  CHECK(cudaFree(dout));
  CHECK(cudaStreamDestroy(s));
  free(host);
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
