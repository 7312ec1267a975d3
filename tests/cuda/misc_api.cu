// Smaller parts of the API programs reach for: peer copies within one
// device, host allocation flags, stream attributes (an L2 access policy
// hint, copied between streams) and the device of a stream; a device by
// its PCI bus id, peer attributes, an executable graph's flags, a
// library's kernels, context-wide events and the hints CUDA ignores on
// these GPUs (shared memory bank sizes, cache preferences, persisting L2
// lines), the driver's entry points among them through
// cudaGetDriverEntryPointByVersion as libraries reach them.
#define TEST_NAME "misc_api"
#include "check.h"
#include <cstring>
#include <cuda.h>

__global__ void scale(float *p, float f, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= f;
}

// A driver entry point of CUDA version `version`, or exit.
template <typename F>
static F entry_point(const char *name, int version) {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q));
  EXPECT(q == cudaDriverEntryPointSuccess && fn != nullptr, "no entry point %s", name);
  return (F)fn;
}

// The driver API's own parts: events of a whole context, hints, kernels
// by handle.
static void driver_parts(float *a) {
  auto ctx_record = entry_point<CUresult (*)(CUcontext, CUevent)>("cuCtxRecordEvent", 12050);
  auto ctx_wait = entry_point<CUresult (*)(CUcontext, CUevent)>("cuCtxWaitEvent", 12050);
  auto ctx_bank = entry_point<CUresult (*)(CUsharedconfig)>("cuCtxSetSharedMemConfig", 4020);
  auto func_bank = entry_point<CUresult (*)(CUfunction, CUsharedconfig)>("cuFuncSetSharedMemConfig", 4020);
  auto kernel_cache = entry_point<CUresult (*)(CUkernel, CUfunc_cache, CUdevice)>("cuKernelSetCacheConfig", 12000);
  auto kernel_name = entry_point<CUresult (*)(const char **, CUkernel)>("cuKernelGetName", 12030);
  auto kernel_param = entry_point<CUresult (*)(CUkernel, size_t, size_t *, size_t *)>("cuKernelGetParamInfo", 12040);
  auto ctx_current = entry_point<CUresult (*)(CUcontext *)>("cuCtxGetCurrent", 4000);

  CUcontext ctx;
  EXPECT(ctx_current(&ctx) == CUDA_SUCCESS && ctx != nullptr, "no current context");
  cudaEvent_t e;
  CHECK(cudaEventCreate(&e));
  const int n = 1 << 16;
  scale<<<n / 256, 256>>>(a, 2.0f, n);
  EXPECT(ctx_record(ctx, (CUevent)e) == CUDA_SUCCESS, "cuCtxRecordEvent failed");
  CHECK(cudaEventSynchronize(e));
  EXPECT(cudaEventQuery(e) == cudaSuccess, "the context's event is not done after its sync");
  EXPECT(ctx_wait(ctx, (CUevent)e) == CUDA_SUCCESS, "cuCtxWaitEvent failed");
  EXPECT(ctx_record(nullptr, (CUevent)e) != CUDA_SUCCESS, "cuCtxRecordEvent of no context");
  CHECK(cudaEventDestroy(e));

  EXPECT(ctx_bank(CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE) == CUDA_SUCCESS, "cuCtxSetSharedMemConfig failed");
  EXPECT(ctx_bank((CUsharedconfig)7) == CUDA_ERROR_INVALID_VALUE, "a bank size of 7 accepted");
  cudaFunction_t f;
  CHECK(cudaGetFuncBySymbol(&f, (const void *)scale));
  EXPECT(func_bank((CUfunction)f, CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE) == CUDA_SUCCESS,
         "cuFuncSetSharedMemConfig failed");
  CUkernel k = (CUkernel)f;
  EXPECT(kernel_cache(k, CU_FUNC_CACHE_PREFER_SHARED, 0) == CUDA_SUCCESS, "cuKernelSetCacheConfig failed");
  EXPECT(kernel_cache(k, CU_FUNC_CACHE_PREFER_SHARED, 9) == CUDA_ERROR_INVALID_DEVICE,
         "cuKernelSetCacheConfig on device 9");
  const char *name = nullptr;
  EXPECT(kernel_name(&name, k) == CUDA_SUCCESS && name && strstr(name, "scale"), "kernel name %s",
         name ? name : "(none)");
  size_t off = 99, size = 99;
  EXPECT(kernel_param(k, 1, &off, &size) == CUDA_SUCCESS && off == 8 && size == 4,
         "parameter 1 at %zu, %zu bytes", off, size);
  EXPECT(kernel_param(k, 3, &off, &size) != CUDA_SUCCESS, "a fourth parameter of three");

  // A library's kernels, counted and listed.
  static const char ptx[] =
      ".version 8.0\n.target sm_80\n.address_size 64\n"
      ".visible .entry first() { ret; }\n.visible .entry second() { ret; }\n";
  auto lib_load = entry_point<CUresult (*)(CUlibrary *, const void *, CUjit_option *, void **, unsigned,
                                           CUlibraryOption *, void **, unsigned)>("cuLibraryLoadData", 12000);
  auto lib_count = entry_point<CUresult (*)(unsigned *, CUlibrary)>("cuLibraryGetKernelCount", 12040);
  auto lib_list = entry_point<CUresult (*)(CUkernel *, unsigned, CUlibrary)>("cuLibraryEnumerateKernels", 12040);
  auto lib_unload = entry_point<CUresult (*)(CUlibrary)>("cuLibraryUnload", 12000);
  CUlibrary lib;
  EXPECT(lib_load(&lib, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0) == CUDA_SUCCESS, "cuLibraryLoadData failed");
  unsigned count = 0;
  EXPECT(lib_count(&count, lib) == CUDA_SUCCESS && count == 2, "%u kernels in the library", count);
  CUkernel ks[2] = {};
  EXPECT(lib_list(ks, 2, lib) == CUDA_SUCCESS && ks[0] && ks[1] && ks[0] != ks[1], "kernels not listed");
  const char *names[2] = {};
  EXPECT(kernel_name(&names[0], ks[0]) == CUDA_SUCCESS && kernel_name(&names[1], ks[1]) == CUDA_SUCCESS &&
             ((!strcmp(names[0], "first") && !strcmp(names[1], "second")) ||
              (!strcmp(names[0], "second") && !strcmp(names[1], "first"))),
         "listed kernels %s and %s", names[0], names[1]);
  EXPECT(lib_unload(lib) == CUDA_SUCCESS, "cuLibraryUnload failed");
  printf("PASS %s driver-parts\n", TEST_NAME);
}

int main() {
  const size_t n = 1 << 20;
  int *a, *b;
  CHECK(cudaMalloc(&a, n));
  CHECK(cudaMalloc(&b, n));
  CHECK(cudaMemset(a, 0x5a, n));
  CHECK(cudaMemcpyPeer(b, 0, a, 0, n));
  unsigned char *h;
  CHECK(cudaHostAlloc((void **)&h, n, cudaHostAllocPortable));
  CHECK(cudaMemcpy(h, b, n, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) EXPECT(h[i] == 0x5a, "byte %zu = %#x after a peer copy", i, h[i]);
  cudaStream_t s, t;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaStreamCreate(&t));
  CHECK(cudaMemsetAsync(a, 0x33, n, s));
  CHECK(cudaMemcpyPeerAsync(b, 0, a, 0, n, s));
  CHECK(cudaMemcpyAsync(h, b, n, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(h[n - 1] == 0x33, "last byte %#x after an async peer copy", h[n - 1]);
  printf("PASS %s peer-copies\n", TEST_NAME);

  unsigned flags = 0;
  CHECK(cudaHostGetFlags(&flags, h));
  EXPECT(flags == cudaHostAllocPortable, "host flags %#x", flags);
  EXPECT(cudaHostGetFlags(&flags, &flags) != cudaSuccess, "flags of memory not CUDA's");
  cudaGetLastError();
  printf("PASS %s host-flags\n", TEST_NAME);

  cudaStreamAttrValue v = {};
  v.accessPolicyWindow.base_ptr = a;
  v.accessPolicyWindow.num_bytes = n;
  v.accessPolicyWindow.hitRatio = 0.5f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
  cudaStreamAttrValue back = {};
  CHECK(cudaStreamCopyAttributes(t, s));
  CHECK(cudaStreamGetAttribute(t, cudaStreamAttributeAccessPolicyWindow, &back));
  EXPECT(back.accessPolicyWindow.base_ptr == a && back.accessPolicyWindow.num_bytes == n &&
             back.accessPolicyWindow.hitRatio == 0.5f,
         "access policy window read back as %p %zu %f", back.accessPolicyWindow.base_ptr,
         back.accessPolicyWindow.num_bytes, back.accessPolicyWindow.hitRatio);
  int dev = -1;
  CHECK(cudaStreamGetDevice(t, &dev));
  EXPECT(dev == 0, "stream device %d", dev);
  printf("PASS %s stream-attributes\n", TEST_NAME);

  // A device by its PCI bus id, with and without the domain.
  char bus[32];
  CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
  int by_id = -1;
  CHECK(cudaDeviceGetByPCIBusId(&by_id, bus));
  EXPECT(by_id == 0, "%s is device %d", bus, by_id);
  by_id = -1;
  CHECK(cudaDeviceGetByPCIBusId(&by_id, strchr(bus, ':') + 1));
  EXPECT(by_id == 0, "%s without its domain is device %d", bus, by_id);
  EXPECT(cudaDeviceGetByPCIBusId(&by_id, "not-a-bus-id") != cudaSuccess, "a malformed bus id");
  EXPECT(cudaDeviceGetByPCIBusId(&by_id, "0000:ff:1f.7") != cudaSuccess, "a bus id of no device");
  cudaGetLastError();
  int p2p = -1;
  EXPECT(cudaDeviceGetP2PAttribute(&p2p, cudaDevP2PAttrAccessSupported, 0, 0) != cudaSuccess,
         "peer attributes of a device with itself");
  cudaGetLastError();
  CHECK(cudaCtxResetPersistingL2Cache());
  printf("PASS %s devices\n", TEST_NAME);

  // An executable graph keeps its flags.
  cudaGraph_t g;
  cudaGraphExec_t x;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  scale<<<1, 256, 0, s>>>((float *)a, 1.0f, 256);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiateWithFlags(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  unsigned long long gflags = 0;
  CHECK(cudaGraphExecGetFlags(x, &gflags));
  EXPECT(gflags == cudaGraphInstantiateFlagAutoFreeOnLaunch, "executable flags %llu", gflags);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  printf("PASS %s graph-flags\n", TEST_NAME);

  driver_parts((float *)a);

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(t));
  CHECK(cudaFreeHost(h));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
