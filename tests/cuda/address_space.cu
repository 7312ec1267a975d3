// Device and host memory share one address space, as unified addressing
// needs: a live device allocation's addresses are held in the process,
// so no host mapping can be placed over them, and pointer attributes
// tell device from host memory by address.
#define TEST_NAME "address_space"
#include "check.h"
#include <cerrno>
#include <cstdint>
#include <sys/mman.h>

// Whether a host mapping of one page at `at` is refused because
// something holds the address (EEXIST).
static bool held(uintptr_t at) {
  void *p = mmap((void *)(at & ~(uintptr_t)4095), 4096, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != MAP_FAILED) {
    munmap(p, 4096);
    return false;
  }
  return errno == EEXIST;
}

int main() {
  const size_t sizes[] = {1000, 1 << 20, 64 << 20};
  void *d[3];
  for (int i = 0; i < 3; i++) {
    CHECK(cudaMalloc(&d[i], sizes[i]));
    uintptr_t a = (uintptr_t)d[i];
    EXPECT(held(a), "no hold on allocation %d's first page (%p)", i, d[i]);
    EXPECT(held(a + sizes[i] / 2), "no hold on allocation %d's middle", i);
    EXPECT(held(a + sizes[i] - 1), "no hold on allocation %d's last byte", i);
  }
  // Host memory made after them lies elsewhere, and is host memory.
  char *h = (char *)malloc(8 << 20);
  for (int i = 0; i < 3; i++) {
    uintptr_t a = (uintptr_t)d[i];
    EXPECT((uintptr_t)h + (8 << 20) <= a || a + sizes[i] <= (uintptr_t)h, "host buffer %p over allocation %d", h, i);
  }
  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, d[1]));
  EXPECT(attr.type == cudaMemoryTypeDevice, "allocation of type %d", (int)attr.type);
  CHECK(cudaPointerGetAttributes(&attr, h));
  EXPECT(attr.type == cudaMemoryTypeUnregistered, "host buffer of type %d", (int)attr.type);
  // A copy with cudaMemcpyDefault finds each side by its address.
  for (int i = 0; i < (1 << 20); i++) h[i] = (char)(i * 7);
  CHECK(cudaMemcpy(d[1], h, 1 << 20, cudaMemcpyDefault));
  CHECK(cudaMemcpy(h + (4 << 20), d[1], 1 << 20, cudaMemcpyDefault));
  for (int i = 0; i < (1 << 20); i++) EXPECT(h[(4 << 20) + i] == (char)(i * 7), "byte %d back", i);
  free(h);
  for (int i = 0; i < 3; i++) CHECK(cudaFree(d[i]));
  printf("PASS %s 3 allocations held, pointer kinds told apart\n", TEST_NAME);
  return 0;
}
