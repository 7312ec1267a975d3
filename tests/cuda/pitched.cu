// Pitched memory as image and matrix code uses it: cudaMallocPitch,
// cudaMemcpy2D in every direction (pageable, and async from pinned
// memory), cudaMemset2D, a kernel over pitched rows, cudaMalloc3D with
// cudaMemcpy3D, and a sub-rectangle copied out of a larger image.
#define TEST_NAME "pitched"
#include "check.h"

#include <cstring>
#include <vector>

// Adds each pixel's row and column to it, row by row at the pitch.
__global__ void mark(float *img, size_t pitch, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) {
    float *row = (float *)((char *)img + y * pitch);
    row[x] += (float)(y * 1000 + x);
  }
}

int main() {
  const int w = 123, h = 77;  // rows that are not a multiple of anything
  size_t pitch = 0;
  float *img;
  CHECK(cudaMallocPitch((void **)&img, &pitch, w * sizeof(float), h));
  EXPECT(pitch >= w * sizeof(float) && pitch % 4 == 0, "pitch %zu for rows of %zu bytes", pitch,
         w * sizeof(float));

  // The padding between rows is set to a marker; the rows' copies and
  // memsets below must never touch it.
  CHECK(cudaMemset2D(img, pitch, 0x7f, pitch, h));
  CHECK(cudaMemset2D(img, pitch, 0, w * sizeof(float), h));

  std::vector<float> host(w * h), back(w * h);
  unsigned s = 7;
  for (auto &v : host) v = (float)(lcg(&s) % 1000);
  CHECK(cudaMemcpy2D(img, pitch, host.data(), w * sizeof(float), w * sizeof(float), h,
                     cudaMemcpyHostToDevice));
  dim3 block(16, 16), grid((w + 15) / 16, (h + 15) / 16);
  mark<<<grid, block>>>(img, pitch, w, h);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy2D(back.data(), w * sizeof(float), img, pitch, w * sizeof(float), h,
                     cudaMemcpyDeviceToHost));
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      float want = host[y * w + x] + (float)(y * 1000 + x);
      EXPECT(back[y * w + x] == want, "pixel (%d, %d) = %f, want %f", x, y, back[y * w + x], want);
    }
  printf("PASS %s copy-2d-kernel pitch=%zu\n", TEST_NAME, pitch);

  // The whole allocation, padding included: the padding kept its marker.
  std::vector<unsigned char> raw(pitch * h);
  CHECK(cudaMemcpy(raw.data(), img, pitch * h, cudaMemcpyDeviceToHost));
  for (int y = 0; y < h; y++)
    for (size_t b = w * sizeof(float); b < pitch; b++)
      EXPECT(raw[y * pitch + b] == 0x7f, "padding byte %zu of row %d is %#x", b, y,
             raw[y * pitch + b]);
  printf("PASS %s padding-untouched\n", TEST_NAME);

  // A sub-rectangle (columns 10..49, rows 5..24) to a packed device
  // buffer, then back to the host, asynchronously through pinned memory.
  const int sw = 40, sh = 20, sx = 10, sy = 5;
  float *sub, *pinned;
  CHECK(cudaMalloc(&sub, sw * sh * sizeof(float)));
  CHECK(cudaMallocHost(&pinned, sw * sh * sizeof(float)));
  CHECK(cudaMemcpy2D(sub, sw * sizeof(float), (char *)img + sy * pitch + sx * sizeof(float), pitch,
                     sw * sizeof(float), sh, cudaMemcpyDeviceToDevice));
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  CHECK(cudaMemcpy2DAsync(pinned, sw * sizeof(float), sub, sw * sizeof(float), sw * sizeof(float),
                          sh, cudaMemcpyDeviceToHost, st));
  CHECK(cudaStreamSynchronize(st));
  for (int y = 0; y < sh; y++)
    for (int x = 0; x < sw; x++) {
      float want = back[(y + sy) * w + x + sx];
      EXPECT(pinned[y * sw + x] == want, "sub (%d, %d) = %f, want %f", x, y, pinned[y * sw + x],
             want);
    }
  // And from pinned memory into the image's pitched rows, async.
  for (int i = 0; i < sw * sh; i++) pinned[i] = -1.0f - i;
  CHECK(cudaMemcpy2DAsync((char *)img + sy * pitch + sx * sizeof(float), pitch, pinned,
                          sw * sizeof(float), sw * sizeof(float), sh, cudaMemcpyHostToDevice, st));
  CHECK(cudaMemcpy2DAsync(back.data(), w * sizeof(float), img, pitch, w * sizeof(float), h,
                          cudaMemcpyDeviceToHost, st));
  CHECK(cudaStreamSynchronize(st));
  for (int y = 0; y < sh; y++)
    for (int x = 0; x < sw; x++)
      EXPECT(back[(y + sy) * w + x + sx] == -1.0f - (y * sw + x), "written (%d, %d) = %f", x, y,
             back[(y + sy) * w + x + sx]);
  EXPECT(back[sy * w + sx - 1] == host[sy * w + sx - 1] + (float)(sy * 1000 + sx - 1),
         "the pixel left of the rectangle changed");
  printf("PASS %s sub-rectangle-async\n", TEST_NAME);

  // A 2D copy whose rows overlap is refused; one row needs no pitch.
  EXPECT(cudaMemcpy2D(sub, 4, host.data(), 8, 8, 2, cudaMemcpyHostToDevice) != cudaSuccess,
         "a destination pitch smaller than the rows was accepted");
  cudaGetLastError();
  CHECK(cudaMemcpy2D(sub, 0, host.data(), 0, 8, 1, cudaMemcpyHostToDevice));
  printf("PASS %s refusals\n", TEST_NAME);

  // 3D: a volume of 9 x 6 x 5 ints in a pitched allocation.
  const int vx = 9, vy = 6, vz = 5;
  cudaExtent ext = make_cudaExtent(vx * sizeof(int), vy, vz);
  cudaPitchedPtr vol;
  CHECK(cudaMalloc3D(&vol, ext));
  std::vector<int> cube(vx * vy * vz), cube_back(vx * vy * vz, 0);
  for (int i = 0; i < vx * vy * vz; i++) cube[i] = i * 3 + 1;
  cudaMemcpy3DParms up = {};
  up.srcPtr = make_cudaPitchedPtr(cube.data(), vx * sizeof(int), vx, vy);
  up.dstPtr = vol;
  up.extent = ext;
  up.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&up));
  cudaMemcpy3DParms down = {};
  down.srcPtr = vol;
  down.dstPtr = make_cudaPitchedPtr(cube_back.data(), vx * sizeof(int), vx, vy);
  down.extent = ext;
  down.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&down));
  EXPECT(memcmp(cube.data(), cube_back.data(), cube.size() * sizeof(int)) == 0,
         "the volume came back changed");
  printf("PASS %s copy-3d pitch=%zu\n", TEST_NAME, vol.pitch);

  CHECK(cudaStreamDestroy(st));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(sub));
  CHECK(cudaFree(vol.ptr));
  CHECK(cudaFree(img));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
