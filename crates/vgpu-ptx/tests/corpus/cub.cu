// CUB's block-wide primitives, the building blocks of Thrust's and CUB's
// device-wide sort and reduce: a radix sort of each block's tile and a
// block reduction, with the bit-field and barrier-reduction instructions
// they compile to.
#include <cub/block/block_load.cuh>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_store.cuh>

constexpr int SORT_THREADS = 128;
constexpr int SORT_ITEMS = 16;

// Sorts each tile of SORT_THREADS * SORT_ITEMS ints in place; the tail
// tile is padded with INT_MAX.
extern "C" __global__ void cub_block_sort(int *keys, int n) {
    using Sort = cub::BlockRadixSort<int, SORT_THREADS, SORT_ITEMS>;
    __shared__ typename Sort::TempStorage tmp;
    int k[SORT_ITEMS];
    int base = blockIdx.x * SORT_THREADS * SORT_ITEMS;
    int valid = n - base;
    cub::LoadDirectBlocked(threadIdx.x, keys + base, k, valid, INT_MAX);
    Sort(tmp).Sort(k);
    cub::StoreDirectBlocked(threadIdx.x, keys + base, k, valid);
}

// Sums n ints: a grid-stride loop, a block reduction, one atomic per block.
extern "C" __global__ void cub_block_reduce(const int *in, unsigned long long *out, int n) {
    using Reduce = cub::BlockReduce<int, 256>;
    __shared__ typename Reduce::TempStorage tmp;
    int sum = 0;
    for (int i = blockIdx.x * 256 + threadIdx.x; i < n; i += gridDim.x * 256) sum += in[i];
    int s = Reduce(tmp).Sum(sum);
    if (threadIdx.x == 0) atomicAdd(out, (unsigned long long)(long long)s);
}

// Predicates counted and combined over the block (bar.red) and bit masks.
extern "C" __global__ void block_votes(const int *in, int *out) {
    int v = in[blockIdx.x * blockDim.x + threadIdx.x];
    int count = __syncthreads_count(v > 0);
    int all = __syncthreads_and(v > -100);
    int any = __syncthreads_or(v == 7);
    if (threadIdx.x == 0) {
        out[3 * blockIdx.x] = count;
        out[3 * blockIdx.x + 1] = all;
        out[3 * blockIdx.x + 2] = any;
    }
}
