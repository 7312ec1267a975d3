// Copies with a host side in graphs, as CUDA graph tutorials write them:
// a captured upload from page-locked memory, a kernel, a captured
// download, replayed with new inputs; memcpy nodes built by hand (a
// pitched upload, a two-row device copy); a capture of a copy from
// pageable memory replayed; a graph whose page-locked memory was freed
// refused at launch.
#define TEST_NAME "graph_copies"
#include "check.h"
#include <vector>

__global__ void twice(const int *in, int *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2 * in[i];
}

int main() {
  const int n = 4096;
  int *h_in, *h_out, *d_in, *d_out;
  CHECK(cudaMallocHost(&h_in, n * sizeof(int)));
  CHECK(cudaMallocHost(&h_out, n * sizeof(int)));
  CHECK(cudaMalloc(&d_in, n * sizeof(int)));
  CHECK(cudaMalloc(&d_out, n * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  cudaGraph_t g;
  cudaGraphExec_t e;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpyAsync(d_in, h_in, n * sizeof(int), cudaMemcpyHostToDevice, s));
  twice<<<n / 256, 256, 0, s>>>(d_in, d_out, n);
  CHECK(cudaMemcpyAsync(h_out, d_out, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamEndCapture(s, &g));
  size_t count = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &count));
  EXPECT(count == 3, "%zu nodes captured", count);
  CHECK(cudaGraphInstantiate(&e, g, 0));
  for (int round = 1; round <= 3; round++) {
    for (int i = 0; i < n; i++) h_in[i] = i * round;
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++)
      EXPECT(h_out[i] == 2 * i * round, "round %d: out[%d] = %d", round, i, h_out[i]);
  }
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphDestroy(g));
  printf("PASS %s captured-upload-download\n", TEST_NAME);

  // Memcpy nodes by hand: 8 rows of 100 ints from page-locked memory
  // into a pitched allocation, then its first two rows to d_out.
  const int w = 100, h = 8;
  size_t pitch;
  int *img;
  CHECK(cudaMallocPitch((void **)&img, &pitch, w * sizeof(int), h));
  for (int i = 0; i < w * h; i++) h_in[i] = 1000 + i;
  CHECK(cudaGraphCreate(&g, 0));
  cudaMemcpy3DParms up = {};
  up.srcPtr = make_cudaPitchedPtr(h_in, w * sizeof(int), w, h);
  up.dstPtr = make_cudaPitchedPtr(img, pitch, w, h);
  up.extent = make_cudaExtent(w * sizeof(int), h, 1);
  up.kind = cudaMemcpyHostToDevice;
  cudaGraphNode_t n_up, n_rows;
  CHECK(cudaGraphAddMemcpyNode(&n_up, g, nullptr, 0, &up));
  cudaMemcpy3DParms rows = {};
  rows.srcPtr = make_cudaPitchedPtr(img, pitch, w, h);
  rows.dstPtr = make_cudaPitchedPtr(d_out, w * sizeof(int), w, 2);
  rows.extent = make_cudaExtent(w * sizeof(int), 2, 1);
  rows.kind = cudaMemcpyDeviceToDevice;
  CHECK(cudaGraphAddMemcpyNode(&n_rows, g, &n_up, 1, &rows));
  CHECK(cudaGraphInstantiate(&e, g, 0));
  CHECK(cudaGraphLaunch(e, s));
  std::vector<int> back(2 * w);
  CHECK(cudaMemcpyAsync(back.data(), d_out, 2 * w * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < 2 * w; i++) EXPECT(back[i] == 1000 + i, "row copy %d = %d", i, back[i]);
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphDestroy(g));
  printf("PASS %s memcpy-nodes\n", TEST_NAME);

  // From pageable memory: captured too, as NVIDIA's driver captures it;
  // each launch reads the memory as it is then.
  std::vector<int> pageable(n, 1);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpyAsync(d_in, pageable.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&e, g, 0));
  for (int i = 0; i < n; i++) pageable[i] = 3 * i + 1;
  CHECK(cudaGraphLaunch(e, s));
  CHECK(cudaStreamSynchronize(s));
  std::vector<int> got(n);
  CHECK(cudaMemcpy(got.data(), d_in, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(got[i] == 3 * i + 1, "pageable upload %d = %d", i, got[i]);
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphDestroy(g));
  printf("PASS %s pageable-captured\n", TEST_NAME);

  // Page-locked memory freed under a graph: its launch is refused.
  int *gone;
  CHECK(cudaMallocHost(&gone, n * sizeof(int)));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpyAsync(d_in, gone, n * sizeof(int), cudaMemcpyHostToDevice, s));
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&e, g, 0));
  CHECK(cudaFreeHost(gone));
  EXPECT(cudaGraphLaunch(e, s) != cudaSuccess, "a graph copying freed host memory launched");
  cudaGetLastError();
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphDestroy(g));
  printf("PASS %s freed-host-memory-refused\n", TEST_NAME);

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(img));
  CHECK(cudaFree(d_in));
  CHECK(cudaFree(d_out));
  CHECK(cudaFreeHost(h_in));
  CHECK(cudaFreeHost(h_out));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
