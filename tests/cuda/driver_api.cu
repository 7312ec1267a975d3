// The driver API as programs that open libcuda.so.1 themselves use it
// (driver-API samples, Numba): a PTX module loaded from a file
// (cuModuleLoad), the JIT linker handing one PTX input on to
// cuModuleLoadData (cuLinkCreate, cuLinkAddData/AddFile, cuLinkComplete),
// and a library loaded from a file (cuLibraryLoadFromFile), each one's
// kernel launched with cuLaunchKernel on the runtime's primary context.
#define TEST_NAME "driver_api"
#include "driver.h"
#include <unistd.h>

static const char kPtx[] =
    ".version 7.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    ".visible .entry add_one(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b32 %r<6>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r2, %r2, %r3, %r4;\n"
    "  setp.ge.s32 %p1, %r2, %r1;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.s32 %rd3, %r2, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r5, [%rd4];\n"
    "  add.s32 %r5, %r5, 1;\n"
    "  st.global.u32 [%rd4], %r5;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";


int main() {
  SYM(cuModuleLoad);
  SYM(cuModuleLoadData);
  SYM(cuModuleGetFunction);
  SYM(cuModuleUnload);
  SYM(cuLaunchKernel);
  SYM(cuLinkCreate_v2);
  SYM(cuLinkAddData_v2);
  SYM(cuLinkAddFile_v2);
  SYM(cuLinkComplete);
  SYM(cuLinkDestroy);
  SYM(cuLibraryLoadFromFile);
  SYM(cuLibraryGetKernel);
  SYM(cuKernelGetFunction);
  SYM(cuLibraryUnload);
  SYM(cuModuleGetFunctionCount);
  SYM(cuModuleEnumerateFunctions);
  SYM(cuOccupancyMaxPotentialBlockSizeWithFlags);

  // The runtime makes the primary context current; the driver API
  // calls below use it.
  const int n = 1000;
  int *d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMemset(d, 0, n * sizeof(int)));
  char path[] = "/tmp/driver_api_XXXXXX";
  int fd = mkstemp(path);
  EXPECT(fd >= 0, "mkstemp");
  EXPECT(write(fd, kPtx, sizeof(kPtx) - 1) == (ssize_t)(sizeof(kPtx) - 1), "write");
  close(fd);

  int want = 0;
  auto launch = [&](CUfunction f) {
    int count = n;
    void *args[] = {&d, &count};
    DRV(cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
    want++;
    int h[n];
    CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT(h[i] == want, "h[%d] = %d, want %d", i, h[i], want);
  };

  CUmodule m;
  CUfunction f;
  DRV(cuModuleLoad(&m, path));
  DRV(cuModuleGetFunction(&f, m, "add_one"));
  launch(f);
  unsigned count = 0;
  DRV(cuModuleGetFunctionCount(&count, m));
  EXPECT(count == 1, "%u functions", count);
  CUfunction listed = nullptr;
  DRV(cuModuleEnumerateFunctions(&listed, 1, m));
  EXPECT(listed == f, "the module lists %p, not its kernel %p", (void *)listed, (void *)f);
  int min_grid = 0, block = 0;
  DRV(cuOccupancyMaxPotentialBlockSizeWithFlags(&min_grid, &block, f, nullptr, 0, 0, 0));
  EXPECT(block >= 32 && block <= 1024 && block % 32 == 0 && min_grid > 0, "block %d, grid %d", block,
         min_grid);
  DRV(cuModuleUnload(m));
  EXPECT(cuModuleLoad(&m, "/nonexistent.ptx") == CUDA_ERROR_FILE_NOT_FOUND, "a missing file");
  printf("PASS %s module-load-file\n", TEST_NAME);

  for (int from_file = 0; from_file < 2; from_file++) {
    CUlinkState link;
    DRV(cuLinkCreate_v2(0, nullptr, nullptr, &link));
    if (from_file)
      DRV(cuLinkAddFile_v2(link, CU_JIT_INPUT_PTX, path, 0, nullptr, nullptr));
    else
      DRV(cuLinkAddData_v2(link, CU_JIT_INPUT_PTX, (void *)kPtx, sizeof(kPtx), "add_one.ptx", 0,
                           nullptr, nullptr));
    void *image = nullptr;
    size_t size = 0;
    DRV(cuLinkComplete(link, &image, &size));
    EXPECT(image != nullptr && size > 0, "linked image %p of %zu bytes", image, size);
    DRV(cuModuleLoadData(&m, image));
    DRV(cuLinkDestroy(link));
    DRV(cuModuleGetFunction(&f, m, "add_one"));
    launch(f);
    DRV(cuModuleUnload(m));
  }
  printf("PASS %s link\n", TEST_NAME);

  CUlibrary l;
  CUkernel k;
  DRV(cuLibraryLoadFromFile(&l, path, nullptr, nullptr, 0, nullptr, nullptr, 0));
  DRV(cuLibraryGetKernel(&k, l, "add_one"));
  DRV(cuKernelGetFunction(&f, k));
  launch(f);
  DRV(cuLibraryUnload(l));
  printf("PASS %s library-load-file\n", TEST_NAME);

  unlink(path);
  CHECK(cudaFree(d));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
