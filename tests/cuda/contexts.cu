// Contexts as driver-API programs make them, with no help from the
// runtime: CUDA 13's cuCtxCreate (cuCtxCreate_v4: no parameters, empty
// parameters), the form cuGetProcAddress gives each CUDA version,
// execution affinity and CIG answered as the device says it supports
// them, creation flags checked, and one context made on the main
// thread, popped, then made current on several threads at once
// (cuCtxPushCurrent or cuCtxSetCurrent), each allocating, launching and
// checking its own result against the CPU.
#define TEST_NAME "contexts"
#include "driver.h"
#include <thread>
#include <vector>

// out[i] = i * k + t, for i < n.
static const char kPtx[] =
    ".version 7.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    ".visible .entry affine(.param .u64 out, .param .u32 n, .param .u32 k, .param .u32 t)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b32 %r<9>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [out];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  ld.param.u32 %r6, [k];\n"
    "  ld.param.u32 %r7, [t];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r2, %r2, %r3, %r4;\n"
    "  setp.ge.s32 %p1, %r2, %r1;\n"
    "  @%p1 bra DONE;\n"
    "  mad.lo.s32 %r8, %r2, %r6, %r7;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.s32 %rd3, %r2, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  st.global.u32 [%rd4], %r8;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

typedef CUresult (*CtxCreateV2)(CUcontext *, unsigned, CUdevice);
typedef CUresult (*CtxCreateV3)(CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice);
typedef CUresult (*CtxCreateV4)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);

int main() {
  SYM(cuInit);
  SYM(cuDeviceGet);
  SYM(cuDeviceGetAttribute);
  SYM(cuDeviceGetExecAffinitySupport);
  SYM(cuCtxGetExecAffinity);
  SYM(cuGetProcAddress_v2);
  SYM(cuCtxCreate_v4);
  SYM(cuCtxDestroy_v2);
  SYM(cuCtxGetCurrent);
  SYM(cuCtxSetCurrent);
  SYM(cuCtxPushCurrent_v2);
  SYM(cuCtxPopCurrent_v2);
  SYM(cuCtxGetDevice);
  SYM(cuCtxSynchronize);
  SYM(cuModuleLoadData);
  SYM(cuModuleGetFunction);
  SYM(cuModuleUnload);
  SYM(cuMemAlloc_v2);
  SYM(cuMemFree_v2);
  SYM(cuMemcpyDtoH_v2);
  SYM(cuLaunchKernel);

  DRV(cuInit(0));
  CUdevice dev;
  DRV(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr, cur = nullptr;

  // No parameters and empty parameters: an ordinary context, current.
  DRV(cuCtxCreate_v4(&ctx, nullptr, 0, dev));
  DRV(cuCtxGetCurrent(&cur));
  EXPECT(cur == ctx && ctx != nullptr, "the new context is not current");
  CUdevice got = -1;
  DRV(cuCtxGetDevice(&got));
  EXPECT(got == dev, "context of device %d, want %d", got, dev);
  DRV(cuCtxDestroy_v2(ctx));
  CUctxCreateParams empty = {};
  DRV(cuCtxCreate_v4(&ctx, &empty, CU_CTX_SCHED_BLOCKING_SYNC, dev));
  DRV(cuCtxDestroy_v2(ctx));
  // Two scheduling policies at once.
  CUresult r = cuCtxCreate_v4(&ctx, nullptr, CU_CTX_SCHED_SPIN | CU_CTX_SCHED_YIELD, dev);
  EXPECT(r == CUDA_ERROR_INVALID_VALUE, "two scheduling flags: %d", (int)r);
  printf("PASS %s create\n", TEST_NAME);

  // Each CUDA version's form of cuCtxCreate, called as that version's
  // cuda.h declares it.
  void *fn = nullptr;
  CUdriverProcAddressQueryResult st;
  DRV(cuGetProcAddress_v2("cuCtxCreate", &fn, 13000, 0, &st));
  DRV(((CtxCreateV4)fn)(&ctx, nullptr, 0, dev));
  DRV(cuCtxDestroy_v2(ctx));
  DRV(cuGetProcAddress_v2("cuCtxCreate", &fn, 11040, 0, &st));
  DRV(((CtxCreateV3)fn)(&ctx, nullptr, 0, 0, dev));
  DRV(cuCtxDestroy_v2(ctx));
  DRV(cuGetProcAddress_v2("cuCtxCreate", &fn, 3020, 0, &st));
  DRV(((CtxCreateV2)fn)(&ctx, 0, dev));
  DRV(cuCtxDestroy_v2(ctx));
  printf("PASS %s proc-address\n", TEST_NAME);

  // Execution affinity (SM counts) where the device supports it, and a
  // context shared with a graphics API (CIG) where it does not.
  int sms = 0, affinity = -1, cig_vk = -1, cig_d3d = -1;
  DRV(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  DRV(cuDeviceGetExecAffinitySupport(&affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT, dev));
  CUexecAffinityParam aff = {};
  aff.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT;
  aff.param.smCount.val = sms;
  CUctxCreateParams with_affinity = {};
  with_affinity.execAffinityParams = &aff;
  with_affinity.numExecAffinityParams = 1;
  r = cuCtxCreate_v4(&ctx, &with_affinity, 0, dev);
  if (affinity) {
    EXPECT(r == CUDA_SUCCESS, "execution affinity the device supports: %d", (int)r);
    DRV(cuCtxDestroy_v2(ctx));
  } else {
    EXPECT(r == CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "unsupported execution affinity: %d",
           (int)r);
    // An ordinary context has every SM.
    DRV(cuCtxCreate_v4(&ctx, nullptr, 0, dev));
    CUexecAffinityParam have = {};
    DRV(cuCtxGetExecAffinity(&have, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
    EXPECT(have.param.smCount.val == (unsigned)sms, "a context of %u SMs of %d",
           have.param.smCount.val, sms);
    DRV(cuCtxDestroy_v2(ctx));
  }
  // Parameters with no affinity in them: an ordinary context.
  with_affinity.numExecAffinityParams = 0;
  DRV(cuCtxCreate_v4(&ctx, &with_affinity, 0, dev));
  DRV(cuCtxDestroy_v2(ctx));
  DRV(cuDeviceGetAttribute(&cig_vk, CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED, dev));
  DRV(cuDeviceGetAttribute(&cig_d3d, CU_DEVICE_ATTRIBUTE_D3D12_CIG_SUPPORTED, dev));
  if (!cig_vk && !cig_d3d) {
    char blob[64] = {};
    CUctxCigParam cig = {CIG_DATA_TYPE_NV_BLOB, blob};
    CUctxCreateParams with_cig = {};
    with_cig.cigParams = &cig;
    r = cuCtxCreate_v4(&ctx, &with_cig, 0, dev);
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "CIG on a device without it: %d", (int)r);
    cig.sharedData = nullptr;
    r = cuCtxCreate_v4(&ctx, &with_cig, 0, dev);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "CIG without its data: %d", (int)r);
  }
  DRV(cuCtxGetCurrent(&cur));
  EXPECT(cur == nullptr, "a refused creation left context %p current", (void *)cur);
  printf("PASS %s params\n", TEST_NAME);

  // One context, made here and popped, used by several threads at once.
  DRV(cuCtxCreate_v4(&ctx, nullptr, 0, dev));
  CUmodule m;
  CUfunction f;
  DRV(cuModuleLoadData(&m, kPtx));
  DRV(cuModuleGetFunction(&f, m, "affine"));
  CUcontext popped = nullptr;
  DRV(cuCtxPopCurrent_v2(&popped));
  EXPECT(popped == ctx, "popped %p, made %p", (void *)popped, (void *)ctx);
  DRV(cuCtxGetCurrent(&cur));
  EXPECT(cur == nullptr, "context %p still current after the pop", (void *)cur);

  const int threads = 4, n = 5000;
  std::vector<int> ok(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t]() {
      // Half push it, half set it.
      CUresult e = t % 2 ? cuCtxPushCurrent_v2(ctx) : cuCtxSetCurrent(ctx);
      if (e != CUDA_SUCCESS) return;
      CUdeviceptr d;
      if (cuMemAlloc_v2(&d, n * sizeof(int)) != CUDA_SUCCESS) return;
      for (int round = 0; round < 3; round++) {
        int count = n, k = t + 2, add = round * 100 + t;
        void *args[] = {&d, &count, &k, &add};
        if (cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr) !=
            CUDA_SUCCESS)
          return;
        std::vector<int> h(n);
        if (cuMemcpyDtoH_v2(h.data(), d, n * sizeof(int)) != CUDA_SUCCESS) return;
        for (int i = 0; i < n; i++)
          if (h[i] != i * k + add) {
            printf("thread %d: out[%d] = %d, want %d\n", t, i, h[i], i * k + add);
            return;
          }
      }
      if (cuMemFree_v2(d) != CUDA_SUCCESS) return;
      CUcontext mine = nullptr;
      if (cuCtxGetCurrent(&mine) != CUDA_SUCCESS || mine != ctx) return;
      e = t % 2 ? cuCtxPopCurrent_v2(nullptr) : cuCtxSetCurrent(nullptr);
      ok[t] = e == CUDA_SUCCESS;
    });
  }
  for (auto &th : pool) th.join();
  for (int t = 0; t < threads; t++) EXPECT(ok[t], "thread %d failed", t);
  DRV(cuCtxPushCurrent_v2(ctx));
  DRV(cuModuleUnload(m));
  DRV(cuCtxPopCurrent_v2(nullptr));
  DRV(cuCtxDestroy_v2(ctx));
  printf("PASS %s threads\n", TEST_NAME);
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
