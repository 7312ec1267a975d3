// Cooperative groups' grid-wide sync: each block writes, the grid syncs
// twice, and each block reads what its neighbour wrote before each sync.
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

extern "C" __global__ void grid_rotate(int *a, int *b, int *c) {
    cg::grid_group grid = cg::this_grid();
    unsigned n = gridDim.x * blockDim.x;
    unsigned i = grid.thread_rank();
    a[i] = i * 3 + 1;
    grid.sync();
    // Every thread's write is visible: take the one a block ahead.
    b[i] = a[(i + blockDim.x) % n];
    grid.sync();
    c[i] = b[(i + blockDim.x) % n] + (grid.is_valid() ? 1000 : 0);
}
