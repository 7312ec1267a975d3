// Relocatable device code (nvcc -rdc -ptx) that the module_load program
// links with link_lib.cu's through cuLink*: a function and a variable
// defined there, and an internal table of the same name as one there.
extern __device__ int poly(int x);
extern __device__ int bias;
static __device__ int table[4] = {1, 2, 3, 4};

extern "C" __global__ void combine(int *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = poly(i) + bias + table[i % 4];
}
