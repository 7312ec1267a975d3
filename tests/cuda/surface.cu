// Surface objects as the CUDA programming guide describes them: a kernel
// writes a 2D array of floats with surf2Dwrite (x in bytes), another
// reads it back with surf2Dread, the host copies the array out; uchar4
// elements, a layered surface, and the out-of-range modes (zero and
// clamp) of surf2Dread. Every value is checked against the CPU's.
#define TEST_NAME "surface"
#include "check.h"

#include <cstring>
#include <vector>

__global__ void write_f(cudaSurfaceObject_t s, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) surf2Dwrite((float)(y * 1000 + x) * 0.5f, s, x * (int)sizeof(float), y);
}

// Doubles each element through the surface, and copies it out.
__global__ void double_f(cudaSurfaceObject_t s, float *out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) {
    float v = surf2Dread<float>(s, x * (int)sizeof(float), y);
    surf2Dwrite(v * 2.0f, s, x * (int)sizeof(float), y);
    out[y * w + x] = v;
  }
}

__global__ void write_rgba(cudaSurfaceObject_t s, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h)
    surf2Dwrite(make_uchar4(x, y, x ^ y, 255 - x), s, x * (int)sizeof(uchar4), y);
}

__global__ void write_layers(cudaSurfaceObject_t s, int w, int h) {
  int x = threadIdx.x, y = threadIdx.y, l = blockIdx.x;
  if (x < w && y < h) surf2DLayeredwrite(l * 10000 + y * 100 + x, s, x * (int)sizeof(int), y, l);
}

// Reads at (x, y) element coordinates out of range: mode zero or clamp.
__global__ void read_edges(cudaSurfaceObject_t s, const int *xy, float *out, int n, bool zero) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    int x = xy[2 * i] * (int)sizeof(float), y = xy[2 * i + 1];
    out[i] = zero ? surf2Dread<float>(s, x, y, cudaBoundaryModeZero)
                  : surf2Dread<float>(s, x, y, cudaBoundaryModeClamp);
  }
}

static cudaSurfaceObject_t surface_of(cudaArray_t a) {
  cudaResourceDesc res;
  memset(&res, 0, sizeof(res));
  res.resType = cudaResourceTypeArray;
  res.res.array.array = a;
  cudaSurfaceObject_t s = 0;
  CHECK(cudaCreateSurfaceObject(&s, &res));
  EXPECT(s != 0, "a surface object handle of 0");
  return s;
}

int main() {
  const int w = 45, h = 17;
  cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
  cudaArray_t arr;
  CHECK(cudaMallocArray(&arr, &fd, w, h, cudaArraySurfaceLoadStore));
  cudaSurfaceObject_t s = surface_of(arr);
  write_f<<<dim3((w + 31) / 32, h), 32>>>(s, w, h);
  CHECK(cudaGetLastError());
  std::vector<float> got(w * h);
  CHECK(cudaMemcpy2DFromArray(got.data(), w * sizeof(float), arr, 0, 0, w * sizeof(float), h,
                              cudaMemcpyDeviceToHost));
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      EXPECT(got[y * w + x] == (float)(y * 1000 + x) * 0.5f, "element (%d, %d) = %f", x, y,
             got[y * w + x]);
  printf("PASS %s write-2d %dx%d\n", TEST_NAME, w, h);

  float *dout;
  CHECK(cudaMalloc(&dout, w * h * sizeof(float)));
  double_f<<<dim3((w + 31) / 32, h), 32>>>(s, dout, w, h);
  CHECK(cudaGetLastError());
  std::vector<float> read(w * h);
  CHECK(cudaMemcpy(read.data(), dout, w * h * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy2DFromArray(got.data(), w * sizeof(float), arr, 0, 0, w * sizeof(float), h,
                              cudaMemcpyDeviceToHost));
  for (int i = 0; i < w * h; i++) {
    float want = (float)((i / w) * 1000 + i % w) * 0.5f;
    EXPECT(read[i] == want && got[i] == 2.0f * want, "element %d read %f, then %f; want %f", i,
           read[i], got[i], want);
  }
  printf("PASS %s read-modify-write\n", TEST_NAME);

  // Out of range: zero mode reads 0, clamp mode the nearest element.
  {
    const int pts[][2] = {{-1, 0}, {w, 3}, {5, -2}, {7, h}, {w + 9, h + 9}, {3, 4}};
    const int n = sizeof(pts) / sizeof(pts[0]);
    int *dxy;
    float *dres;
    CHECK(cudaMalloc(&dxy, sizeof(pts)));
    CHECK(cudaMalloc(&dres, n * sizeof(float)));
    CHECK(cudaMemcpy(dxy, pts, sizeof(pts), cudaMemcpyHostToDevice));
    for (int zero = 0; zero < 2; zero++) {
      read_edges<<<1, 32>>>(s, dxy, dres, n, zero);
      CHECK(cudaGetLastError());
      float res[n];
      CHECK(cudaMemcpy(res, dres, sizeof(res), cudaMemcpyDeviceToHost));
      for (int i = 0; i < n; i++) {
        int x = pts[i][0], y = pts[i][1];
        bool inside = x >= 0 && x < w && y >= 0 && y < h;
        int cx = x < 0 ? 0 : (x >= w ? w - 1 : x), cy = y < 0 ? 0 : (y >= h ? h - 1 : y);
        float want = (zero && !inside) ? 0.0f : got[cy * w + cx];
        EXPECT(res[i] == want, "%s read at (%d, %d): %f, want %f", zero ? "zero" : "clamp", x, y,
               res[i], want);
      }
    }
    CHECK(cudaFree(dxy));
    CHECK(cudaFree(dres));
    printf("PASS %s boundary-modes\n", TEST_NAME);
  }
  CHECK(cudaDestroySurfaceObject(s));

  // uchar4 elements.
  {
    const int cw = 20, ch = 9;
    cudaChannelFormatDesc cd = cudaCreateChannelDesc<uchar4>();
    cudaArray_t ca;
    CHECK(cudaMallocArray(&ca, &cd, cw, ch, cudaArraySurfaceLoadStore));
    cudaSurfaceObject_t cs = surface_of(ca);
    write_rgba<<<dim3(1, ch), 32>>>(cs, cw, ch);
    CHECK(cudaGetLastError());
    std::vector<uchar4> px(cw * ch);
    CHECK(cudaMemcpy2DFromArray(px.data(), cw * sizeof(uchar4), ca, 0, 0, cw * sizeof(uchar4), ch,
                                cudaMemcpyDeviceToHost));
    for (int y = 0; y < ch; y++)
      for (int x = 0; x < cw; x++) {
        uchar4 p = px[y * cw + x];
        EXPECT(p.x == x && p.y == y && p.z == (x ^ y) && p.w == 255 - x,
               "pixel (%d, %d) = (%d, %d, %d, %d)", x, y, p.x, p.y, p.z, p.w);
      }
    CHECK(cudaDestroySurfaceObject(cs));
    CHECK(cudaFreeArray(ca));
    printf("PASS %s uchar4\n", TEST_NAME);
  }

  // A layered surface of ints.
  {
    const int lw = 8, lh = 5, layers = 4;
    cudaChannelFormatDesc id = cudaCreateChannelDesc<int>();
    cudaArray_t la;
    CHECK(cudaMalloc3DArray(&la, &id, make_cudaExtent(lw, lh, layers),
                            cudaArrayLayered | cudaArraySurfaceLoadStore));
    cudaSurfaceObject_t ls = surface_of(la);
    write_layers<<<layers, dim3(lw, lh)>>>(ls, lw, lh);
    CHECK(cudaGetLastError());
    std::vector<int> vals(lw * lh * layers);
    cudaMemcpy3DParms p;
    memset(&p, 0, sizeof(p));
    p.srcArray = la;
    p.dstPtr = make_cudaPitchedPtr(vals.data(), lw * sizeof(int), lw, lh);
    p.extent = make_cudaExtent(lw, lh, layers);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    for (int l = 0; l < layers; l++)
      for (int y = 0; y < lh; y++)
        for (int x = 0; x < lw; x++) {
          int v = vals[(l * lh + y) * lw + x];
          EXPECT(v == l * 10000 + y * 100 + x, "layer %d (%d, %d) = %d", l, x, y, v);
        }
    CHECK(cudaDestroySurfaceObject(ls));
    CHECK(cudaFreeArray(la));
    printf("PASS %s layered %dx%dx%d\n", TEST_NAME, lw, lh, layers);
  }

  // An array made without cudaArraySurfaceLoadStore takes a surface object
  // too: NVIDIA's driver makes one (an H100, driver 580), whatever the
  // documentation of the flag suggests.
  {
    cudaArray_t plain;
    CHECK(cudaMallocArray(&plain, &fd, 4, 4));
    cudaResourceDesc res;
    memset(&res, 0, sizeof(res));
    res.resType = cudaResourceTypeArray;
    res.res.array.array = plain;
    cudaSurfaceObject_t any = 0;
    CHECK(cudaCreateSurfaceObject(&any, &res));
    EXPECT(any != 0, "a surface object of 0");
    CHECK(cudaDestroySurfaceObject(any));
    CHECK(cudaFreeArray(plain));
    printf("PASS %s without-surface-flag\n", TEST_NAME);
  }

  CHECK(cudaFreeArray(arr));
  CHECK(cudaFree(dout));
  printf("PASS %s done\n", TEST_NAME);
  return 0;
}
