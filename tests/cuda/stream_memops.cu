// Stream memory operations on page-locked host memory, as programs that
// signal between the CPU and a stream use them: a stream waits until the
// CPU writes a flag (the kernel after the wait sees what the CPU wrote
// before it), another writes a word the CPU waits for, and the
// conditions and sizes the driver API offers.
#define TEST_NAME "stream_memops"
#include "driver.h"


__global__ void copy_word(const volatile unsigned *src, unsigned *dst) { *dst = *src; }

int main() {
  SYM(cuStreamWaitValue32_v2);
  SYM(cuStreamWaitValue64_v2);
  SYM(cuStreamWriteValue32_v2);
  SYM(cuStreamWriteValue64_v2);
  SYM(cuStreamBatchMemOp_v2);
  SYM(cuDeviceGetAttribute);

  volatile unsigned long long *host;
  CHECK(cudaHostAlloc((void **)&host, 4096, cudaHostAllocDefault));
  for (int i = 0; i < 8; i++) host[i] = 0;
  unsigned *data, *out;
  CHECK(cudaMalloc(&data, sizeof(unsigned)));
  CHECK(cudaMalloc(&out, sizeof(unsigned)));
  CHECK(cudaMemset(data, 0, sizeof(unsigned)));
  // The runtime has initialised the driver by now.
  int attr = 0;
  DRV(cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0));
  EXPECT(attr == 1, "64-bit stream memory operations are not offered (%d)", attr);
  cudaStream_t s, w;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
  CUdeviceptr flag = (CUdeviceptr)&host[0];

  // 1. The stream waits for the CPU's flag; what the CPU copied to the
  // device before the flag is what the kernel after the wait reads.
  DRV(cuStreamWaitValue32_v2((CUstream)s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
  copy_word<<<1, 1, 0, s>>>(data, out);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady ? cudaSuccess : cudaErrorUnknown);
  unsigned v = 77;
  CHECK(cudaMemcpy(data, &v, sizeof(v), cudaMemcpyHostToDevice));
  *(volatile unsigned *)&host[0] = 1;
  CHECK(cudaStreamSynchronize(s));
  unsigned got = 0;
  CHECK(cudaMemcpy(&got, out, sizeof(got), cudaMemcpyDeviceToHost));
  EXPECT(got == 77, "the kernel after the wait read %u, want 77", got);

  // 2. A stream writes words the CPU waits for, in the stream's order.
  DRV(cuStreamWriteValue32_v2((CUstream)w, (CUdeviceptr)&host[1], 5, 0));
  DRV(cuStreamWriteValue64_v2((CUstream)w, (CUdeviceptr)&host[2], 0x1122334455667788ull, 0));
  while (host[2] != 0x1122334455667788ull) {
  }
  EXPECT((unsigned)host[1] == 5, "the 32-bit word reads %u, want 5", (unsigned)host[1]);

  // 3. Conditions that hold let the stream go on at once; a 64-bit wait
  // that wraps counts forward.
  host[3] = 0x0000000100000005ull;
  DRV(cuStreamWaitValue64_v2((CUstream)w, (CUdeviceptr)&host[3], ~0ull - 2, CU_STREAM_WAIT_VALUE_GEQ));
  DRV(cuStreamWaitValue32_v2((CUstream)w, (CUdeviceptr)&host[3], 5, CU_STREAM_WAIT_VALUE_EQ));
  DRV(cuStreamWaitValue32_v2((CUstream)w, (CUdeviceptr)&host[3], 4, CU_STREAM_WAIT_VALUE_AND));
  DRV(cuStreamWaitValue32_v2((CUstream)w, (CUdeviceptr)&host[3], 2, CU_STREAM_WAIT_VALUE_NOR));
  CHECK(cudaStreamSynchronize(w));

  // 4. A batch: the stream waits for the CPU, then writes two words in
  // order, behind a barrier.
  CUstreamBatchMemOpParams ops[4] = {};
  ops[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[0].waitValue.address = (CUdeviceptr)&host[4];
  ops[0].waitValue.value = 9;
  ops[0].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[1].writeValue.address = (CUdeviceptr)&host[5];
  ops[1].writeValue.value = 10;
  ops[2].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
  ops[2].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_SYS;
  ops[3].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[3].writeValue.address = (CUdeviceptr)&host[6];
  ops[3].writeValue.value64 = 11;
  DRV(cuStreamBatchMemOp_v2((CUstream)w, 4, ops, 0));
  CHECK(cudaStreamQuery(w) == cudaErrorNotReady ? cudaSuccess : cudaErrorUnknown);
  EXPECT(host[5] == 0 && host[6] == 0, "the batch wrote before its wait held");
  host[4] = 9;
  while (host[6] != 11) {
  }
  EXPECT(host[5] == 10, "the batch's first write reads %llu, want 10", host[5]);
  CHECK(cudaStreamSynchronize(w));

  // 5. Misaligned words and unknown flags are refused.
  EXPECT(cuStreamWriteValue64_v2((CUstream)w, (CUdeviceptr)&host[1] + 4, 1, 0) == CUDA_ERROR_INVALID_VALUE,
         "a misaligned 64-bit word was taken");
  EXPECT(cuStreamWaitValue32_v2((CUstream)w, flag, 1, 1u << 20) == CUDA_ERROR_INVALID_VALUE,
         "an unknown flag was taken");
  ops[0].operation = (CUstreamBatchMemOpType)42;
  EXPECT(cuStreamBatchMemOp_v2((CUstream)w, 1, ops, 0) == CUDA_ERROR_INVALID_VALUE,
         "an unknown batch operation was taken");

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(w));
  CHECK(cudaFreeHost((void *)host));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
