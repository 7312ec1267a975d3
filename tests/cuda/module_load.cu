// Every way the driver API loads code, with no help from the runtime:
// a PTX file (cuModuleLoad), a fatbinary file of PTX, PTX from memory
// with JIT options (cuModuleLoadDataEx: the info and error logs filled,
// their sizes written back, the wall time), two relocatable PTX inputs
// linked into one module (cuLinkCreate/AddData/AddFile/Complete) with a
// function and a variable of one used by the other, libraries from a
// file and from memory with options, and machine code for another GPU
// (an sm_80 cubin: CUDA_ERROR_NO_BINARY_FOR_GPU on this Hopper-class
// device). Each kernel's result is checked against the CPU. The files
// are built beside the program by tests/cuda/build.sh (module_load.d/).
#define TEST_NAME "module_load"
#include "driver.h"
#include <cmath>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

static std::string dir;

static std::string path_of(const char *name) { return dir + "/module_load.d/" + name; }

static std::string slurp(const char *name) {
  std::string p = path_of(name);
  FILE *f = fopen(p.c_str(), "rb");
  EXPECT(f != nullptr, "cannot open %s", p.c_str());
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  fclose(f);
  return s;
}

// A log as the driver wrote it: NUL-terminated within its buffer, and
// its length written back (the buffer's size where it was cut).
static void check_log(const char *what, const char *buf, size_t cap, size_t written) {
  size_t len = strnlen(buf, cap);
  EXPECT(len < cap, "%s log is not NUL-terminated", what);
  EXPECT(written == len || (written == cap && len == cap - 1),
         "%s log: %zu bytes written back, it holds %zu", what, written, len);
}

int main() {
  char exe[4096];
  ssize_t n_exe = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  EXPECT(n_exe > 0, "readlink");
  exe[n_exe] = 0;
  dir = exe;
  dir.resize(dir.rfind('/'));

  SYM(cuInit);
  SYM(cuDeviceGet);
  SYM(cuCtxCreate_v4);
  SYM(cuCtxDestroy_v2);
  SYM(cuMemAlloc_v2);
  SYM(cuMemFree_v2);
  SYM(cuMemcpyHtoD_v2);
  SYM(cuMemcpyDtoH_v2);
  SYM(cuModuleLoad);
  SYM(cuModuleLoadData);
  SYM(cuModuleLoadDataEx);
  SYM(cuModuleGetFunction);
  SYM(cuModuleUnload);
  SYM(cuLaunchKernel);
  SYM(cuCtxSynchronize);
  SYM(cuLinkCreate_v2);
  SYM(cuLinkAddData_v2);
  SYM(cuLinkAddFile_v2);
  SYM(cuLinkComplete);
  SYM(cuLinkDestroy);
  SYM(cuLibraryLoadFromFile);
  SYM(cuLibraryLoadData);
  SYM(cuLibraryGetKernel);
  SYM(cuKernelGetFunction);
  SYM(cuLibraryUnload);

  DRV(cuInit(0));
  CUdevice dev;
  DRV(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  DRV(cuCtxCreate_v4(&ctx, nullptr, 0, dev));

  const int n = 3000;
  std::vector<float> x(n), y0(n), y(n);
  unsigned seed = 7;
  for (int i = 0; i < n; i++) {
    x[i] = (float)(lcg(&seed) % 2000) / 100.0f - 10.0f;
    y0[i] = (float)(lcg(&seed) % 2000) / 100.0f - 10.0f;
  }
  CUdeviceptr dx, dy;
  DRV(cuMemAlloc_v2(&dx, n * sizeof(float)));
  DRV(cuMemAlloc_v2(&dy, n * sizeof(float)));
  DRV(cuMemcpyHtoD_v2(dx, x.data(), n * sizeof(float)));

  // y = a*x (scale) or y = a*x + y (saxpy) by `f`, checked on the CPU.
  auto run = [&](CUfunction f, bool axpy, float a, const char *what) {
    DRV(cuMemcpyHtoD_v2(dy, y0.data(), n * sizeof(float)));
    int count = n;
    void *args[] = {&dy, &dx, &a, &count};
    DRV(cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    DRV(cuCtxSynchronize());
    DRV(cuMemcpyDtoH_v2(y.data(), dy, n * sizeof(float)));
    for (int i = 0; i < n; i++) {
      // The device may fuse a*x + y into one rounding.
      float want = axpy ? a * x[i] + y0[i] : a * x[i];
      float tol = 1e-5f * (fabsf(want) > 1.0f ? fabsf(want) : 1.0f);
      EXPECT(fabsf(y[i] - want) <= tol, "%s: y[%d] = %g, want %g", what, i, y[i], want);
    }
  };

  // A PTX file, and a fatbinary file holding PTX.
  CUmodule m;
  CUfunction f;
  DRV(cuModuleLoad(&m, path_of("scale.ptx").c_str()));
  DRV(cuModuleGetFunction(&f, m, "scale"));
  run(f, false, 2.5f, "scale.ptx");
  DRV(cuModuleGetFunction(&f, m, "saxpy"));
  run(f, true, -1.5f, "saxpy of scale.ptx");
  DRV(cuModuleUnload(m));
  DRV(cuModuleLoad(&m, path_of("scale.fatbin").c_str()));
  DRV(cuModuleGetFunction(&f, m, "saxpy"));
  run(f, true, 0.75f, "scale.fatbin");
  DRV(cuModuleUnload(m));
  printf("PASS %s file\n", TEST_NAME);

  // PTX from memory with JIT options: logs, their sizes written back,
  // the wall time, and hints.
  std::string ptx = slurp("scale.ptx");
  char info[1024], error[1024];
  memset(info, 'x', sizeof(info));
  memset(error, 'x', sizeof(error));
  CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_LOG_VERBOSE,      CU_JIT_WALL_TIME,
                         CU_JIT_OPTIMIZATION_LEVEL};
  const unsigned n_opts = sizeof(opts) / sizeof(opts[0]);
  void *vals[n_opts];
  auto reset = [&]() {
    vals[0] = info;
    vals[1] = (void *)sizeof(info);
    vals[2] = error;
    vals[3] = (void *)sizeof(error);
    vals[4] = (void *)1;
    vals[5] = nullptr;
    vals[6] = (void *)3;
  };
  reset();
  DRV(cuModuleLoadDataEx(&m, ptx.c_str(), n_opts, opts, vals));
  check_log("info", info, sizeof(info), (size_t)vals[1]);
  check_log("error", error, sizeof(error), (size_t)vals[3]);
  EXPECT(error[0] == 0, "a module that loaded has an error log: %s", error);
  float wall;
  memcpy(&wall, &vals[5], sizeof(wall));
  EXPECT(wall >= 0.0f && wall < 600000.0f, "wall time %g ms", wall);
  DRV(cuModuleGetFunction(&f, m, "saxpy"));
  run(f, true, 3.0f, "cuModuleLoadDataEx");
  DRV(cuModuleUnload(m));

  // PTX that does not compile: CUDA_ERROR_INVALID_PTX, said in the
  // error log.
  std::string bad = ptx;
  size_t at = bad.find("ret;");
  EXPECT(at != std::string::npos, "scale.ptx has no ret");
  bad.replace(at, 4, "no_such_instruction.u32 %r1;");
  reset();
  CUresult r = cuModuleLoadDataEx(&m, bad.c_str(), n_opts, opts, vals);
  EXPECT(r == CUDA_ERROR_INVALID_PTX, "bad PTX: %d, want CUDA_ERROR_INVALID_PTX", (int)r);
  check_log("error", error, sizeof(error), (size_t)vals[3]);
  EXPECT(error[0] != 0, "bad PTX left the error log empty");
  // A log cut to a small buffer: NUL-terminated, the buffer counted.
  reset();
  vals[3] = (void *)10;
  r = cuModuleLoadDataEx(&m, bad.c_str(), n_opts, opts, vals);
  EXPECT(r == CUDA_ERROR_INVALID_PTX, "bad PTX again: %d", (int)r);
  EXPECT((size_t)vals[3] == 10 && strlen(error) == 9,
         "a log cut to 10 bytes: %zu written back, %zu held", (size_t)vals[3], strlen(error));
  // Malformed options.
  CUjit_option unknown = (CUjit_option)9999;
  void *unknown_val = nullptr;
  r = cuModuleLoadDataEx(&m, ptx.c_str(), 1, &unknown, &unknown_val);
  EXPECT(r == CUDA_ERROR_INVALID_VALUE, "an unknown JIT option: %d", (int)r);
  r = cuModuleLoadDataEx(&m, ptx.c_str(), 1, nullptr, nullptr);
  EXPECT(r == CUDA_ERROR_INVALID_VALUE, "a count without options: %d", (int)r);
  printf("PASS %s data-ex\n", TEST_NAME);

  // Two relocatable PTX inputs, one from memory and one from a file,
  // linked into one module.
  CUlinkState link;
  reset();
  DRV(cuLinkCreate_v2(n_opts, opts, vals, &link));
  std::string main_ptx = slurp("link_main.ptx");
  DRV(cuLinkAddData_v2(link, CU_JIT_INPUT_PTX, (void *)main_ptx.c_str(), main_ptx.size() + 1,
                       "link_main.ptx", 0, nullptr, nullptr));
  DRV(cuLinkAddFile_v2(link, CU_JIT_INPUT_PTX, path_of("link_lib.ptx").c_str(), 0, nullptr,
                       nullptr));
  void *image = nullptr;
  size_t image_size = 0;
  DRV(cuLinkComplete(link, &image, &image_size));
  EXPECT(image != nullptr && image_size > 0, "linked image %p of %zu bytes", image, image_size);
  check_log("link info", info, sizeof(info), (size_t)vals[1]);
  check_log("link error", error, sizeof(error), (size_t)vals[3]);
  DRV(cuModuleLoadData(&m, image));
  DRV(cuLinkDestroy(link));
  DRV(cuModuleGetFunction(&f, m, "combine"));
  const int k = 1000;
  CUdeviceptr dout;
  DRV(cuMemAlloc_v2(&dout, k * sizeof(int)));
  int count = k;
  void *args[] = {&dout, &count};
  DRV(cuLaunchKernel(f, (k + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
  std::vector<int> out(k);
  DRV(cuMemcpyDtoH_v2(out.data(), dout, k * sizeof(int)));
  const int main_table[4] = {1, 2, 3, 4}, lib_table[4] = {10, 20, 30, 40};
  for (int i = 0; i < k; i++) {
    int want = 3 * i * i + lib_table[i % 4] + 1000 + main_table[i % 4];
    EXPECT(out[i] == want, "combine: out[%d] = %d, want %d", i, out[i], want);
  }
  DRV(cuMemFree_v2(dout));
  DRV(cuModuleUnload(m));
  // A link of nothing: a module without functions.
  DRV(cuLinkCreate_v2(0, nullptr, nullptr, &link));
  DRV(cuLinkComplete(link, &image, &image_size));
  DRV(cuModuleLoadData(&m, image));
  EXPECT(cuModuleGetFunction(&f, m, "combine") == CUDA_ERROR_NOT_FOUND, "an empty link's kernel");
  DRV(cuModuleUnload(m));
  DRV(cuLinkDestroy(link));
  printf("PASS %s link\n", TEST_NAME);

  // Libraries: from a file with JIT options, from memory (a fatbinary).
  CUlibrary lib;
  CUkernel kern;
  reset();
  DRV(cuLibraryLoadFromFile(&lib, path_of("scale.ptx").c_str(), opts, vals, n_opts, nullptr,
                            nullptr, 0));
  check_log("library info", info, sizeof(info), (size_t)vals[1]);
  DRV(cuLibraryGetKernel(&kern, lib, "scale"));
  DRV(cuKernelGetFunction(&f, kern));
  run(f, false, -4.0f, "cuLibraryLoadFromFile");
  DRV(cuLibraryUnload(lib));
  std::string fatbin = slurp("scale.fatbin");
  CUlibraryOption lib_opt = CU_LIBRARY_BINARY_IS_PRESERVED;
  void *lib_val = (void *)1;
  DRV(cuLibraryLoadData(&lib, fatbin.data(), nullptr, nullptr, 0, &lib_opt, &lib_val, 1));
  DRV(cuLibraryGetKernel(&kern, lib, "saxpy"));
  DRV(cuKernelGetFunction(&f, kern));
  run(f, true, 0.5f, "cuLibraryLoadData");
  DRV(cuLibraryUnload(lib));
  CUlibraryOption bad_opt = (CUlibraryOption)77;
  r = cuLibraryLoadData(&lib, fatbin.data(), nullptr, nullptr, 0, &bad_opt, &lib_val, 1);
  EXPECT(r == CUDA_ERROR_INVALID_VALUE, "an unknown library option: %d", (int)r);
  printf("PASS %s library\n", TEST_NAME);

  // Machine code for another GPU (Ampere's sm_80 on a Hopper-class
  // device), from a file and from memory.
  r = cuModuleLoad(&m, path_of("scale_sm80.cubin").c_str());
  EXPECT(r == CUDA_ERROR_NO_BINARY_FOR_GPU, "an sm_80 cubin file: %d", (int)r);
  std::string cubin = slurp("scale_sm80.cubin");
  r = cuModuleLoadData(&m, cubin.data());
  EXPECT(r == CUDA_ERROR_NO_BINARY_FOR_GPU, "an sm_80 cubin: %d", (int)r);
  printf("PASS %s cubin\n", TEST_NAME);

  DRV(cuMemFree_v2(dx));
  DRV(cuMemFree_v2(dy));
  DRV(cuCtxDestroy_v2(ctx));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
