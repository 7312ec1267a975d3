// Host functions in a stream (cudaLaunchHostFunc, cudaStreamAddCallback):
// each runs once the stream's earlier work is done and before its later
// work starts, so it can read what a copy before it brought back and
// write what a copy after it sends. And host functions in graphs, from a
// capture and as host nodes (set in the graph and in an executable),
// between kernels that work on managed memory the function reads and
// writes.
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

// In graphs: reads what the kernel before it wrote, writes what the
// kernel after it reads.
struct Step {
  int *m;
  int calls;
  int seen;
  int give;
};

static void CUDART_CB step(void *arg) {
  Step *st = (Step *)arg;
  st->calls++;
  st->seen = st->m[0];
  st->m[1] = st->give;
}

static void CUDART_CB step_twice(void *arg) {
  Step *st = (Step *)arg;
  st->calls += 2;
  st->m[1] = 2 * st->give;
}

__global__ void set_first(int *m, int v) { m[0] = v; }
__global__ void add_second_to_third(int *m) { m[2] += m[1]; }

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

  // Captured: kernel, host function, kernel; launched twice.
  int *m;
  CHECK(cudaMallocManaged(&m, 3 * sizeof(int)));
  m[0] = m[1] = m[2] = 0;
  Step st = {m, 0, -1, 100};
  cudaStream_t cs;
  CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t e;
  CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  set_first<<<1, 1, 0, cs>>>(m, 7);
  CHECK(cudaLaunchHostFunc(cs, step, &st));
  add_second_to_third<<<1, 1, 0, cs>>>(m);
  CHECK(cudaStreamEndCapture(cs, &g));
  EXPECT(st.calls == 0, "the captured host function ran at capture");
  CHECK(cudaGraphInstantiate(&e, g, 0));
  for (int i = 0; i < 2; i++) CHECK(cudaGraphLaunch(e, cs));
  CHECK(cudaStreamSynchronize(cs));
  EXPECT(st.calls == 2 && st.seen == 7, "host node ran %d times, saw %d", st.calls, st.seen);
  EXPECT(m[2] == 200, "m[2] = %d, want 200", m[2]);
  size_t n_nodes = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &n_nodes));
  cudaGraphNode_t nodes[3];
  CHECK(cudaGraphGetNodes(g, nodes, &n_nodes));
  cudaGraphNodeType type;
  CHECK(cudaGraphNodeGetType(nodes[1], &type));
  EXPECT(n_nodes == 3 && type == cudaGraphNodeTypeHost, "%zu nodes, the second of type %d", n_nodes,
         (int)type);
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphDestroy(g));
  printf("PASS %s captured-host-node\n", TEST_NAME);

  // Built node by node; the host node's function changed in the graph,
  // then in an executable.
  m[0] = m[1] = m[2] = 0;
  st = {m, 0, -1, 5};
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t k1, hn, k2;
  int seven = 7;
  void *args1[] = {&m, &seven};
  cudaKernelNodeParams kp = {};
  kp.func = (void *)set_first;
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(1);
  kp.kernelParams = args1;
  CHECK(cudaGraphAddKernelNode(&k1, g, nullptr, 0, &kp));
  cudaHostNodeParams hp = {};
  hp.fn = step;
  hp.userData = &st;
  CHECK(cudaGraphAddHostNode(&hn, g, &k1, 1, &hp));
  void *args2[] = {&m};
  kp.func = (void *)add_second_to_third;
  kp.kernelParams = args2;
  CHECK(cudaGraphAddKernelNode(&k2, g, &hn, 1, &kp));
  cudaHostNodeParams back = {};
  CHECK(cudaGraphHostNodeGetParams(hn, &back));
  EXPECT(back.fn == step && back.userData == &st, "host node parameters read back wrong");
  CHECK(cudaGraphInstantiate(&e, g, 0));
  CHECK(cudaGraphLaunch(e, cs));
  CHECK(cudaStreamSynchronize(cs));
  EXPECT(st.calls == 1 && st.seen == 7 && m[2] == 5, "calls %d, seen %d, m[2] %d", st.calls, st.seen,
         m[2]);
  hp.fn = step_twice;
  CHECK(cudaGraphExecHostNodeSetParams(e, hn, &hp));
  CHECK(cudaGraphLaunch(e, cs));
  CHECK(cudaStreamSynchronize(cs));
  EXPECT(st.calls == 3 && m[2] == 15, "after the executable's change: calls %d, m[2] %d", st.calls,
         m[2]);
  CHECK(cudaGraphHostNodeSetParams(hn, &hp));
  cudaGraphExec_t e2;
  CHECK(cudaGraphInstantiate(&e2, g, 0));
  CHECK(cudaGraphLaunch(e2, cs));
  CHECK(cudaStreamSynchronize(cs));
  EXPECT(st.calls == 5 && m[2] == 25, "after the graph's change: calls %d, m[2] %d", st.calls, m[2]);
  CHECK(cudaGraphExecDestroy(e2));
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(cs));
  CHECK(cudaFree(m));
  printf("PASS %s host-nodes\n", TEST_NAME);

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFreeHost(h));
  CHECK(cudaFree(d));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
