// Texture objects as the CUDA programming guide describes them, checked
// against a CPU reference of its "Texture Fetching" appendix: a 2D CUDA
// array sampled with nearest-point and linear filtering, unnormalised
// and normalised coordinates, clamp, border, wrap and mirror addressing;
// a layered array, a 3D array, cubemaps (layered too), a pitched 2D
// texture of uchar4 read as normalised floats, and tex1Dfetch of linear
// memory.
#define TEST_NAME "texture"
#include "check.h"

#include <cmath>
#include <cstring>
#include <vector>

// Each thread samples at (xs[i], ys[i]) and writes what it read.
__global__ void sample2d(cudaTextureObject_t t, const float *xs, const float *ys, float *out,
                         int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2D<float>(t, xs[i], ys[i]);
}

__global__ void sample_layered(cudaTextureObject_t t, float *out, int w, int h, int layers) {
  int x = threadIdx.x, y = threadIdx.y, l = blockIdx.x;
  if (x < w && y < h && l < layers)
    out[(l * h + y) * w + x] = tex2DLayered<float>(t, x + 0.5f, y + 0.5f, l);
}

__global__ void sample3d(cudaTextureObject_t t, const float *xyz, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex3D<float>(t, xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]);
}

// Thread i samples the cubemap in direction dirs[i] (of cube layer
// `layer`, where the cubemap is layered).
__global__ void sample_cube(cudaTextureObject_t t, const float *dirs, float *out, int n,
                            int layer) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = dirs[3 * i], y = dirs[3 * i + 1], z = dirs[3 * i + 2];
  out[i] = layer < 0 ? texCubemap<float>(t, x, y, z) : texCubemapLayered<float>(t, x, y, z, layer);
}

__global__ void sample_rgba(cudaTextureObject_t t, float4 *out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float4>(t, x + 0.5f, y + 0.5f);
}

__global__ void fetch1d(cudaTextureObject_t t, int *out, int n, int from) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<int>(t, from + i);
}

enum Mode { WRAP, CLAMP, MIRROR, BORDER };

// The texel index along a dimension of n texels, by the address mode;
// -1 for the border.
static int address(int i, int n, Mode m) {
  switch (m) {
    case WRAP: return ((i % n) + n) % n;
    case MIRROR: {
      int k = ((i % (2 * n)) + 2 * n) % (2 * n);
      return k < n ? k : 2 * n - 1 - k;
    }
    case BORDER: return (i < 0 || i >= n) ? -1 : i;
    default: return i < 0 ? 0 : (i >= n ? n - 1 : i);
  }
}

// The guide's fetch of a 2D texture at unnormalised (x, y): nearest
// point, or linear with the weights in 8 fraction bits.
static float reference(const std::vector<float> &img, int w, int h, float x, float y, bool linear,
                       Mode m, float border) {
  auto at = [&](int i, int j) {
    int a = address(i, w, m), b = address(j, h, m);
    return (a < 0 || b < 0) ? border : img[b * w + a];
  };
  if (!linear) return at((int)floorf(x), (int)floorf(y));
  float xb = x - 0.5f, yb = y - 0.5f;
  int i = (int)floorf(xb), j = (int)floorf(yb);
  float a = roundf((xb - floorf(xb)) * 256.0f) / 256.0f;
  float b = roundf((yb - floorf(yb)) * 256.0f) / 256.0f;
  return (1 - a) * (1 - b) * at(i, j) + a * (1 - b) * at(i + 1, j) + (1 - a) * b * at(i, j + 1) +
         a * b * at(i + 1, j + 1);
}

static cudaTextureObject_t texture_of(cudaArray_t arr, bool linear, bool normalized, Mode m,
                                      float border) {
  cudaResourceDesc res;
  memset(&res, 0, sizeof(res));
  res.resType = cudaResourceTypeArray;
  res.res.array.array = arr;
  cudaTextureDesc td;
  memset(&td, 0, sizeof(td));
  cudaTextureAddressMode am = m == WRAP     ? cudaAddressModeWrap
                              : m == MIRROR ? cudaAddressModeMirror
                              : m == BORDER ? cudaAddressModeBorder
                                            : cudaAddressModeClamp;
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = am;
  td.filterMode = linear ? cudaFilterModeLinear : cudaFilterModePoint;
  td.readMode = cudaReadModeElementType;
  td.normalizedCoords = normalized;
  for (int c = 0; c < 4; c++) td.borderColor[c] = border;
  cudaTextureObject_t t = 0;
  CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
  EXPECT(t != 0, "a texture object handle of 0");
  return t;
}

int main() {
  // A 2D array of floats: rows that are not a multiple of anything.
  const int w = 37, h = 23;
  std::vector<float> img(w * h);
  unsigned s = 11;
  for (auto &v : img) v = (float)(lcg(&s) % 64) * 0.25f;
  cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
  cudaArray_t arr;
  CHECK(cudaMallocArray(&arr, &fd, w, h));
  CHECK(cudaMemcpy2DToArray(arr, 0, 0, img.data(), w * sizeof(float), w * sizeof(float), h,
                            cudaMemcpyHostToDevice));
  {
    cudaChannelFormatDesc got;
    cudaExtent ext;
    unsigned flags;
    CHECK(cudaArrayGetInfo(&got, &ext, &flags, arr));
    EXPECT(got.x == 32 && got.f == cudaChannelFormatKindFloat && ext.width == (size_t)w &&
               ext.height == (size_t)h && ext.depth == 0,
           "array info %d bits kind %d, %zu x %zu x %zu", got.x, (int)got.f, ext.width, ext.height,
           ext.depth);
    std::vector<float> back(w * h);
    CHECK(cudaMemcpy2DFromArray(back.data(), w * sizeof(float), arr, 0, 0, w * sizeof(float), h,
                                cudaMemcpyDeviceToHost));
    EXPECT(back == img, "the array read back differs");
    printf("PASS %s array-round-trip %dx%d\n", TEST_NAME, w, h);
  }

  // Sample points across the image and past its edges, never within a
  // tenth of a texel of a texel's edge (where nearest-point sampling of a
  // coordinate the hardware rounds could go either way).
  const int n = 1024;
  std::vector<float> xs(n), ys(n), out(n);
  for (int i = 0; i < n; i++) {
    xs[i] = -6.0f + (float)(lcg(&s) % (w + 12)) + 0.1f + 0.8f * (float)(lcg(&s) % 1000) / 1000.0f;
    ys[i] = -6.0f + (float)(lcg(&s) % (h + 12)) + 0.1f + 0.8f * (float)(lcg(&s) % 1000) / 1000.0f;
  }
  float *dx, *dy, *dout;
  CHECK(cudaMalloc(&dx, n * sizeof(float)));
  CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CHECK(cudaMalloc(&dout, n * sizeof(float)));
  float range = 16.0f;  // texel values span [0, 16)
  struct Case {
    const char *name;
    bool linear, normalized;
    Mode mode;
  } cases[] = {
      {"point-clamp", false, false, CLAMP},   {"linear-clamp", true, false, CLAMP},
      {"point-border", false, false, BORDER}, {"linear-border", true, false, BORDER},
      {"point-wrap", false, true, WRAP},      {"linear-wrap", true, true, WRAP},
      {"point-mirror", false, true, MIRROR},  {"linear-mirror", true, true, MIRROR},
  };
  for (const Case &c : cases) {
    const float border = -3.5f;
    cudaTextureObject_t t = texture_of(arr, c.linear, c.normalized, c.mode, border);
    // Normalised coordinates are the same points divided by the size.
    std::vector<float> u(n), v(n);
    for (int i = 0; i < n; i++) {
      u[i] = c.normalized ? xs[i] / w : xs[i];
      v[i] = c.normalized ? ys[i] / h : ys[i];
    }
    CHECK(cudaMemcpy(dx, u.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, v.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    sample2d<<<(n + 127) / 128, 128>>>(t, dx, dy, dout, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
      float x = c.normalized ? u[i] * w : u[i], y = c.normalized ? v[i] * h : v[i];
      float want = reference(img, w, h, x, y, c.linear, c.mode, border);
      // Linear weights are 8-bit fractions on the GPU: at most 1/256 of
      // the texels' spread per dimension apart from this reference.
      float tol = c.linear ? 2.0f * (range + 4.0f) / 256.0f : 0.0f;
      EXPECT(fabsf(out[i] - want) <= tol, "%s at (%f, %f): %f, want %f", c.name, x, y, out[i],
             want);
    }
    CHECK(cudaDestroyTextureObject(t));
    printf("PASS %s %s\n", TEST_NAME, c.name);
  }

  // A layered 2D array: three layers, each its own image.
  {
    const int lw = 9, lh = 7, layers = 3;
    std::vector<float> lay(lw * lh * layers);
    for (int i = 0; i < lw * lh * layers; i++) lay[i] = (float)(i * 3 % 101);
    cudaArray_t la;
    CHECK(cudaMalloc3DArray(&la, &fd, make_cudaExtent(lw, lh, layers), cudaArrayLayered));
    cudaMemcpy3DParms p;
    memset(&p, 0, sizeof(p));
    p.srcPtr = make_cudaPitchedPtr(lay.data(), lw * sizeof(float), lw, lh);
    p.dstArray = la;
    p.extent = make_cudaExtent(lw, lh, layers);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    cudaTextureObject_t t = texture_of(la, false, false, CLAMP, 0.0f);
    float *lout;
    CHECK(cudaMalloc(&lout, lay.size() * sizeof(float)));
    sample_layered<<<layers, dim3(lw, lh)>>>(t, lout, lw, lh, layers);
    CHECK(cudaGetLastError());
    std::vector<float> got(lay.size());
    CHECK(cudaMemcpy(got.data(), lout, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < got.size(); i++)
      EXPECT(got[i] == lay[i], "layered texel %zu: %f, want %f", i, got[i], lay[i]);
    CHECK(cudaDestroyTextureObject(t));
    CHECK(cudaFreeArray(la));
    CHECK(cudaFree(lout));
    printf("PASS %s layered %dx%dx%d\n", TEST_NAME, lw, lh, layers);
  }

  // A 3D array, sampled at texel centres and, linearly, between them.
  {
    const int vw = 6, vh = 5, vd = 4, m = vw * vh * vd;
    std::vector<float> vol(m);
    for (int i = 0; i < m; i++) vol[i] = (float)(i * 7 % 13);
    cudaArray_t va;
    CHECK(cudaMalloc3DArray(&va, &fd, make_cudaExtent(vw, vh, vd)));
    cudaMemcpy3DParms p;
    memset(&p, 0, sizeof(p));
    p.srcPtr = make_cudaPitchedPtr(vol.data(), vw * sizeof(float), vw, vh);
    p.dstArray = va;
    p.extent = make_cudaExtent(vw, vh, vd);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    std::vector<float> xyz(3 * m);
    for (int i = 0; i < m; i++) {
      xyz[3 * i] = i % vw + 0.5f;
      xyz[3 * i + 1] = (i / vw) % vh + 0.5f;
      xyz[3 * i + 2] = i / (vw * vh) + 0.5f;
    }
    float *dxyz, *vout;
    CHECK(cudaMalloc(&dxyz, xyz.size() * sizeof(float)));
    CHECK(cudaMalloc(&vout, m * sizeof(float)));
    CHECK(cudaMemcpy(dxyz, xyz.data(), xyz.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaTextureObject_t t = texture_of(va, false, false, CLAMP, 0.0f);
    sample3d<<<(m + 63) / 64, 64>>>(t, dxyz, vout, m);
    CHECK(cudaGetLastError());
    std::vector<float> got(m);
    CHECK(cudaMemcpy(got.data(), vout, m * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < m; i++) EXPECT(got[i] == vol[i], "3D texel %d: %f, want %f", i, got[i], vol[i]);
    CHECK(cudaDestroyTextureObject(t));
    // Halfway between texel (1, 1, 1) and (2, 2, 2): the mean of the 8.
    t = texture_of(va, true, false, CLAMP, 0.0f);
    float mid[3] = {2.0f, 2.0f, 2.0f};
    CHECK(cudaMemcpy(dxyz, mid, sizeof(mid), cudaMemcpyHostToDevice));
    sample3d<<<1, 1>>>(t, dxyz, vout, 1);
    CHECK(cudaGetLastError());
    float one;
    CHECK(cudaMemcpy(&one, vout, sizeof(one), cudaMemcpyDeviceToHost));
    float want = 0;
    for (int k = 1; k <= 2; k++)
      for (int j = 1; j <= 2; j++)
        for (int i = 1; i <= 2; i++) want += vol[(k * vh + j) * vw + i] / 8.0f;
    EXPECT(fabsf(one - want) < 1e-4f, "trilinear: %f, want %f", one, want);
    CHECK(cudaDestroyTextureObject(t));
    CHECK(cudaFreeArray(va));
    CHECK(cudaFree(dxyz));
    CHECK(cudaFree(vout));
    printf("PASS %s volume %dx%dx%d\n", TEST_NAME, vw, vh, vd);
  }

  // Cubemaps: the guide's table picks the face by the direction's
  // largest component and the texel by the other two. The direction to
  // the centre of texel (i, j) of each face, the table read backwards.
  {
    const int cw = 4, faces = 6, cubes = 2;
    std::vector<float> texels(cw * cw * faces * cubes);
    for (size_t k = 0; k < texels.size(); k++) texels[k] = (float)(k * 5 % 997);
    std::vector<float> dirs;
    std::vector<int> which;  // face * cw * cw + j * cw + i
    for (int f = 0; f < faces; f++)
      for (int j = 0; j < cw; j++)
        for (int i = 0; i < cw; i++) {
          float sc = 2.0f * (i + 0.5f) / cw - 1.0f, tc = 2.0f * (j + 0.5f) / cw - 1.0f;
          float v[6][3] = {{1, -tc, -sc}, {-1, -tc, sc}, {sc, 1, tc},
                           {sc, -1, -tc}, {sc, -tc, 1}, {-sc, -tc, -1}};
          dirs.insert(dirs.end(), v[f], v[f] + 3);
          which.push_back((f * cw + j) * cw + i);
        }
    const int n = (int)which.size();
    float *ddirs, *cout;
    CHECK(cudaMalloc(&ddirs, dirs.size() * sizeof(float)));
    CHECK(cudaMalloc(&cout, n * sizeof(float)));
    CHECK(cudaMemcpy(ddirs, dirs.data(), dirs.size() * sizeof(float), cudaMemcpyHostToDevice));
    for (int layered = 0; layered < 2; layered++) {
      int depth = layered ? faces * cubes : faces;
      cudaArray_t ca;
      CHECK(cudaMalloc3DArray(&ca, &fd, make_cudaExtent(cw, cw, depth),
                              cudaArrayCubemap | (layered ? cudaArrayLayered : 0)));
      cudaMemcpy3DParms p;
      memset(&p, 0, sizeof(p));
      p.srcPtr = make_cudaPitchedPtr(texels.data(), cw * sizeof(float), cw, cw);
      p.dstArray = ca;
      p.extent = make_cudaExtent(cw, cw, depth);
      p.kind = cudaMemcpyHostToDevice;
      CHECK(cudaMemcpy3D(&p));
      // Cubemaps take normalised coordinates (the faces' s and t).
      cudaTextureObject_t t = texture_of(ca, false, true, CLAMP, 0.0f);
      for (int cube = 0; cube < (layered ? cubes : 1); cube++) {
        sample_cube<<<(n + 63) / 64, 64>>>(t, ddirs, cout, n, layered ? cube : -1);
        CHECK(cudaGetLastError());
        std::vector<float> got(n);
        CHECK(cudaMemcpy(got.data(), cout, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int k = 0; k < n; k++) {
          float want = texels[cube * faces * cw * cw + which[k]];
          EXPECT(got[k] == want, "cube %d direction (%f, %f, %f): %f, want %f", cube,
                 dirs[3 * k], dirs[3 * k + 1], dirs[3 * k + 2], got[k], want);
        }
      }
      CHECK(cudaDestroyTextureObject(t));
      CHECK(cudaFreeArray(ca));
    }
    CHECK(cudaFree(ddirs));
    CHECK(cudaFree(cout));
    printf("PASS %s cubemaps %dx%d\n", TEST_NAME, cw, cw);
  }

  // Pitched memory of uchar4, read as normalised floats.
  {
    const int pw = 40, ph = 6;
    size_t pitch;
    uchar4 *pimg;
    CHECK(cudaMallocPitch((void **)&pimg, &pitch, pw * sizeof(uchar4), ph));
    std::vector<uchar4> px(pw * ph);
    for (int i = 0; i < pw * ph; i++)
      px[i] = make_uchar4(i % 256, (i * 7) % 256, (i * 13) % 256, 255 - i % 256);
    CHECK(cudaMemcpy2D(pimg, pitch, px.data(), pw * sizeof(uchar4), pw * sizeof(uchar4), ph,
                       cudaMemcpyHostToDevice));
    cudaResourceDesc res;
    memset(&res, 0, sizeof(res));
    res.resType = cudaResourceTypePitch2D;
    res.res.pitch2D.devPtr = pimg;
    res.res.pitch2D.desc = cudaCreateChannelDesc<uchar4>();
    res.res.pitch2D.width = pw;
    res.res.pitch2D.height = ph;
    res.res.pitch2D.pitchInBytes = pitch;
    cudaTextureDesc td;
    memset(&td, 0, sizeof(td));
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeNormalizedFloat;
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    float4 *pout;
    CHECK(cudaMalloc(&pout, pw * ph * sizeof(float4)));
    sample_rgba<<<dim3((pw + 31) / 32, ph), 32>>>(t, pout, pw, ph);
    CHECK(cudaGetLastError());
    std::vector<float4> got(pw * ph);
    CHECK(cudaMemcpy(got.data(), pout, got.size() * sizeof(float4), cudaMemcpyDeviceToHost));
    for (int i = 0; i < pw * ph; i++) {
      float4 g = got[i];
      uchar4 p = px[i];
      EXPECT(fabsf(g.x - p.x / 255.0f) < 1e-6f && fabsf(g.y - p.y / 255.0f) < 1e-6f &&
                 fabsf(g.z - p.z / 255.0f) < 1e-6f && fabsf(g.w - p.w / 255.0f) < 1e-6f,
             "pixel %d: (%f, %f, %f, %f), want (%d, %d, %d, %d) / 255", i, g.x, g.y, g.z, g.w, p.x,
             p.y, p.z, p.w);
    }
    CHECK(cudaDestroyTextureObject(t));
    CHECK(cudaFree(pimg));
    CHECK(cudaFree(pout));
    printf("PASS %s pitch2d-normalized pitch=%zu\n", TEST_NAME, pitch);
  }

  // tex1Dfetch of linear memory: out of range reads zero.
  {
    const int len = 300;
    std::vector<int> lin(len);
    for (int i = 0; i < len; i++) lin[i] = i * i - 1000;
    int *dlin, *dres;
    CHECK(cudaMalloc(&dlin, len * sizeof(int)));
    CHECK(cudaMalloc(&dres, (len + 20) * sizeof(int)));
    CHECK(cudaMemcpy(dlin, lin.data(), len * sizeof(int), cudaMemcpyHostToDevice));
    cudaResourceDesc res;
    memset(&res, 0, sizeof(res));
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = dlin;
    res.res.linear.desc = cudaCreateChannelDesc<int>();
    res.res.linear.sizeInBytes = len * sizeof(int);
    cudaTextureDesc td;
    memset(&td, 0, sizeof(td));
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t t;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    fetch1d<<<(len + 20 + 63) / 64, 64>>>(t, dres, len + 20, -10);
    CHECK(cudaGetLastError());
    std::vector<int> got(len + 20);
    CHECK(cudaMemcpy(got.data(), dres, got.size() * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < len + 20; i++) {
      int k = i - 10;
      int want = (k >= 0 && k < len) ? lin[k] : 0;
      EXPECT(got[i] == want, "fetch %d: %d, want %d", k, got[i], want);
    }
    CHECK(cudaDestroyTextureObject(t));
    CHECK(cudaFree(dlin));
    CHECK(cudaFree(dres));
    printf("PASS %s linear-fetch\n", TEST_NAME);
  }

  CHECK(cudaFreeArray(arr));
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dy));
  CHECK(cudaFree(dout));
  printf("PASS %s done\n", TEST_NAME);
  return 0;
}
