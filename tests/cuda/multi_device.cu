// A process with two vGPUs, as a guest with two functions has: kernels
// on each, no peer access between them, and copies from one device's
// memory to the other's (cudaMemcpyPeer, cudaMemcpyPeerAsync after a
// kernel on the source's stream, cudaMemcpy with cudaMemcpyDefault at
// odd offsets, a box of rows and slices with cudaMemcpy3DPeer), larger
// than the library's 4 MiB staging piece.
// usage: multi_device [DEVICES]   (the count expected, default 2)
#define TEST_NAME "multi_device"
#include "check.h"
#include <vector>

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = seed ^ (unsigned)(i * 2654435761u);
}

static unsigned want(size_t i, unsigned seed) { return seed ^ (unsigned)(i * 2654435761u); }

// Word `i` of device buffer `d` (on device `dev`) is want(i, seed), for
// every i in [from, n).
static void expect_words(int dev, const unsigned *d, size_t from, size_t n, unsigned seed, const char *what) {
  CHECK(cudaSetDevice(dev));
  std::vector<unsigned> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  for (size_t i = from; i < n; i++)
    EXPECT(h[i] == want(i, seed), "%s: word %zu is %#x, want %#x", what, i, h[i], want(i, seed));
}

int main(int argc, char **argv) {
  int expected = argc > 1 ? atoi(argv[1]) : 2;
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  EXPECT(count == expected, "%d devices, want %d", count, expected);
  EXPECT(count >= 2, "needs two devices");

  const size_t n = (6 << 20) / sizeof(unsigned) + 3;  // 6 MiB and 12 bytes
  const size_t bytes = n * sizeof(unsigned);
  unsigned *buf[2];
  cudaStream_t s[2];
  for (int dev = 0; dev < 2; dev++) {
    CHECK(cudaSetDevice(dev));
    CHECK(cudaMalloc(&buf[dev], bytes));
    CHECK(cudaStreamCreate(&s[dev]));
    fill<<<64, 256>>>(buf[dev], n, 0x1000u + dev);
    CHECK(cudaGetLastError());
    cudaPointerAttributes a;
    CHECK(cudaPointerGetAttributes(&a, buf[dev]));
    EXPECT(a.device == dev && a.type == cudaMemoryTypeDevice, "buffer %d: device %d, type %d", dev, a.device,
           (int)a.type);
  }
  expect_words(0, buf[0], 0, n, 0x1000, "device 0's own kernel");
  expect_words(1, buf[1], 0, n, 0x1001, "device 1's own kernel");

  // No peer access between vGPUs; copies go without it.
  int can = -1;
  CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
  EXPECT(can == 0, "cudaDeviceCanAccessPeer says %d", can);
  CHECK(cudaSetDevice(0));
  cudaError_t e = cudaDeviceEnablePeerAccess(1, 0);
  EXPECT(e == cudaErrorPeerAccessUnsupported, "cudaDeviceEnablePeerAccess: %s", cudaGetErrorName(e));
  (void)cudaGetLastError();

  // 1. The synchronous peer copy.
  CHECK(cudaMemcpyPeer(buf[0], 0, buf[1], 1, bytes));
  expect_words(0, buf[0], 0, n, 0x1001, "cudaMemcpyPeer 1 -> 0");

  // 2. The asynchronous one, after a kernel queued on the source's stream.
  CHECK(cudaSetDevice(1));
  fill<<<64, 256, 0, s[1]>>>(buf[1], n, 0x2002);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpyPeerAsync(buf[0], 0, buf[1], 1, bytes, s[1]));
  CHECK(cudaStreamSynchronize(s[1]));
  expect_words(0, buf[0], 0, n, 0x2002, "cudaMemcpyPeerAsync after a kernel");

  // 3. Unified addressing: cudaMemcpyDefault finds both devices; an odd
  // offset and length, and the words around it kept.
  CHECK(cudaSetDevice(0));
  fill<<<64, 256>>>(buf[0], n, 0x3003);
  CHECK(cudaGetLastError());
  CHECK(cudaSetDevice(1));
  fill<<<64, 256>>>(buf[1], n, 0x4004);
  CHECK(cudaGetLastError());
  const size_t off = 5;
  CHECK(cudaMemcpy(buf[1] + off, buf[0] + off, bytes - off * sizeof(unsigned) - 4, cudaMemcpyDefault));
  std::vector<unsigned> h(n);
  CHECK(cudaMemcpy(h.data(), buf[1], bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    unsigned w = (i < off || i == n - 1) ? want(i, 0x4004) : want(i, 0x3003);
    EXPECT(h[i] == w, "cudaMemcpyDefault 0 -> 1: word %zu is %#x, want %#x", i, h[i], w);
  }

  // 4. A box of rows and slices between pitched buffers of the two
  // devices (cudaMemcpy3DPeer); the bytes around the box kept.
  {
    const size_t pitch = 256, rows = 5, slices = 3, total = pitch * rows * slices;
    unsigned char *box[2];
    std::vector<unsigned char> src(total), dst(total, 0xee), got(total);
    for (size_t i = 0; i < total; i++) src[i] = (unsigned char)(i * 7 + 1);
    for (int dev = 0; dev < 2; dev++) {
      CHECK(cudaSetDevice(dev));
      CHECK(cudaMalloc(&box[dev], total));
      CHECK(cudaMemcpy(box[dev], dev == 0 ? src.data() : dst.data(), total, cudaMemcpyHostToDevice));
    }
    cudaMemcpy3DPeerParms p = {};
    p.srcPtr = make_cudaPitchedPtr(box[0], pitch, 200, rows);
    p.srcPos = make_cudaPos(8, 1, 0);
    p.srcDevice = 0;
    p.dstPtr = make_cudaPitchedPtr(box[1], pitch, 200, rows);
    p.dstPos = make_cudaPos(16, 0, 1);
    p.dstDevice = 1;
    p.extent = make_cudaExtent(100, 3, 2);
    CHECK(cudaMemcpy3DPeer(&p));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemcpy(got.data(), box[1], total, cudaMemcpyDeviceToHost));
    for (size_t z = 0; z < slices; z++)
      for (size_t y = 0; y < rows; y++)
        for (size_t x = 0; x < pitch; x++) {
          bool inside = z >= 1 && z < 3 && y < 3 && x >= 16 && x < 116;
          unsigned char want = inside ? src[(z - 1) * pitch * rows + (y + 1) * pitch + (x - 16 + 8)] : 0xee;
          EXPECT(got[z * pitch * rows + y * pitch + x] == want, "cudaMemcpy3DPeer: byte (%zu, %zu, %zu) is %#x, want %#x",
                 x, y, z, got[z * pitch * rows + y * pitch + x], want);
        }
    for (int dev = 0; dev < 2; dev++) {
      CHECK(cudaSetDevice(dev));
      CHECK(cudaFree(box[dev]));
    }
  }

  for (int dev = 0; dev < 2; dev++) {
    CHECK(cudaSetDevice(dev));
    CHECK(cudaStreamDestroy(s[dev]));
    CHECK(cudaFree(buf[dev]));
  }
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
