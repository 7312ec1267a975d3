// Changing graphs after they are made, as inference engines do between
// steps: a kernel node's parameters read back and set (in the graph, and
// in an executable), and an executable updated from a newly captured
// graph of the same topology; a graph of another topology is refused
// with the node at fault, and the caller instantiates again. Then memset
// and memcpy nodes: their parameters read back and set, in the graph and
// in an executable, to as many rows or more.
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
  {
    int got = run(e, s, p);
    EXPECT(got == 6, "first launch: %d, want 6", got);
  }

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
  {
    int got = run(e, s, p);
    EXPECT(got == 104, "after the executable's node changed: %d, want 104", got);
  }
  // Set in the graph: a new instantiation sees it, the old one does not.
  int ten = 10;
  args[1] = &ten;
  CHECK(cudaGraphKernelNodeSetParams(nodes[2], &kp));
  cudaGraphExec_t e2;
  CHECK(cudaGraphInstantiate(&e2, g, 0));
  {
    int got = run(e2, s, p);
    EXPECT(got == 13, "a graph node set to add 10: %d, want 13", got);
  }
  {
    int got = run(e, s, p);
    EXPECT(got == 104, "the executable made before that: %d, want 104", got);
  }
  printf("PASS %s set-params\n", TEST_NAME);

  // Update the first executable from a new capture of the same shape.
  const int second[3] = {1000, 2000, 3000};
  cudaGraph_t g2 = capture(s, p, second, 3);
  cudaGraphExecUpdateResultInfo info = {};
  CHECK(cudaGraphExecUpdate(e, g2, &info));
  EXPECT(info.result == cudaGraphExecUpdateSuccess, "result %d", (int)info.result);
  {
    int got = run(e, s, p);
    EXPECT(got == 6000, "after the update: %d, want 6000", got);
  }
  printf("PASS %s exec-update\n", TEST_NAME);

  // Another topology is refused, and the executable keeps its work.
  cudaGraph_t g3 = capture(s, p, first, 2);
  cudaError_t r = cudaGraphExecUpdate(e, g3, &info);
  EXPECT(r == cudaErrorGraphExecUpdateFailure, "update to 2 nodes: %s", cudaGetErrorString(r));
  EXPECT(info.result == cudaGraphExecUpdateErrorTopologyChanged, "result %d", (int)info.result);
  cudaGetLastError();
  {
    int got = run(e, s, p);
    EXPECT(got == 6000, "after a refused update: %d, want 6000", got);
  }
  // What engines do then: instantiate again.
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphInstantiate(&e, g3, 0));
  {
    int got = run(e, s, p);
    EXPECT(got == 3, "the new instantiation: %d, want 3", got);
  }
  printf("PASS %s topology-changed\n", TEST_NAME);

  // Memset and memcpy nodes: a memset of `rows` rows of `a`, then a copy
  // of `a` into `b`, then a kernel after both.
  {
    const int w = 64, rows_max = 8;
    size_t pitch;
    int *a, *b, *out = (int *)malloc(rows_max * w * sizeof(int));
    CHECK(cudaMallocPitch((void **)&a, &pitch, w * sizeof(int), rows_max));
    CHECK(cudaMalloc(&b, pitch * rows_max));
    CHECK(cudaMemset(a, 0, pitch * rows_max));
    CHECK(cudaMemset(b, 0, pitch * rows_max));
    cudaGraph_t mg;
    CHECK(cudaGraphCreate(&mg, 0));
    cudaMemsetParams m = {};
    m.dst = a;
    m.pitch = pitch;
    m.value = 7;
    m.elementSize = 4;
    m.width = w;
    m.height = 2;
    cudaGraphNode_t set, copy, k;
    CHECK(cudaGraphAddMemsetNode(&set, mg, NULL, 0, &m));
    CHECK(cudaGraphAddMemcpyNode1D(&copy, mg, &set, 1, b, a, pitch * rows_max,
                                   cudaMemcpyDeviceToDevice));
    cudaKernelNodeParams kp = {};
    int v = 1;
    void *args[] = {&p, &v};
    kp.func = (void *)add;
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(1);
    kp.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&k, mg, &copy, 1, &kp));
    cudaMemsetParams got = {};
    CHECK(cudaGraphMemsetNodeGetParams(set, &got));
    EXPECT(got.dst == a && got.value == 7 && got.height == 2 && got.pitch == pitch,
           "the memset node's parameters read back");
    cudaMemcpy3DParms cp = {};
    CHECK(cudaGraphMemcpyNodeGetParams(copy, &cp));
    EXPECT(cp.extent.width == pitch * rows_max, "the memcpy node's width %zu", cp.extent.width);
    cudaGraphExec_t me;
    CHECK(cudaGraphInstantiate(&me, mg, 0));
    // Rows with `value` in their first `w` words, up to `rows`; zero after.
    auto expect_rows = [&](const int *dev, int rows, int value, const char *what) {
      CHECK(cudaMemcpy2D(out, w * sizeof(int), dev, pitch, w * sizeof(int), rows_max,
                         cudaMemcpyDeviceToHost));
      for (int r = 0; r < rows_max; r++)
        for (int i = 0; i < w; i++) {
          int want = r < rows ? value : 0;
          EXPECT(out[r * w + i] == want, "%s: row %d word %d = %d, want %d", what, r, i,
                 out[r * w + i], want);
        }
    };
    CHECK(cudaGraphLaunch(me, s));
    CHECK(cudaStreamSynchronize(s));
    expect_rows(b, 2, 7, "first launch");
    // In the executable: more rows, another value (its work grows).
    m.height = 6;
    m.value = 9;
    CHECK(cudaGraphExecMemsetNodeSetParams(me, set, &m));
    CHECK(cudaGraphLaunch(me, s));
    CHECK(cudaStreamSynchronize(s));
    expect_rows(b, 6, 9, "the executable's memset changed");
    // The graph keeps its own; set there, it reads back.
    CHECK(cudaGraphMemsetNodeGetParams(set, &got));
    EXPECT(got.value == 7 && got.height == 2, "the graph's node kept its parameters");
    m.height = 1;
    m.value = 3;
    CHECK(cudaGraphMemsetNodeSetParams(set, &m));
    CHECK(cudaGraphMemsetNodeGetParams(set, &got));
    EXPECT(got.value == 3 && got.height == 1, "the graph's node took new parameters");
    // The executable's copy goes to `a` itself instead... from `b`: the
    // memset's rows of `a` are overwritten with what `b` holds.
    CHECK(cudaMemset(b, 0, pitch * rows_max));
    cudaMemcpy3DParms back = {};
    back.srcPtr = make_cudaPitchedPtr(b, pitch, w * sizeof(int), rows_max);
    back.dstPtr = make_cudaPitchedPtr(a, pitch, w * sizeof(int), rows_max);
    back.extent = make_cudaExtent(w * sizeof(int), rows_max, 1);
    back.kind = cudaMemcpyDeviceToDevice;
    CHECK(cudaGraphExecMemcpyNodeSetParams(me, copy, &back));
    CHECK(cudaGraphLaunch(me, s));
    CHECK(cudaStreamSynchronize(s));
    expect_rows(a, 0, 0, "the executable's copy reversed");
    CHECK(cudaGraphMemcpyNodeSetParams(copy, &back));
    CHECK(cudaGraphMemcpyNodeGetParams(copy, &cp));
    EXPECT(cp.extent.height == rows_max && cp.dstPtr.ptr == a, "the graph's memcpy node set");
    EXPECT(cudaGraphMemsetNodeGetParams(copy, &got) == cudaErrorInvalidValue,
           "a memcpy node is no memset node");
    cudaGetLastError();
    CHECK(cudaGraphExecDestroy(me));
    CHECK(cudaGraphDestroy(mg));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    free(out);
    printf("PASS %s memset-memcpy-params\n", TEST_NAME);
  }

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
