// Launch and copy figures, printed as "BENCH name value unit" lines, for
// side-by-side runs of the same binary natively and in a guest:
//   launch_sync_p50   an empty kernel launched and waited for, wall
//   launch_device_p50 the device-side part of it (events around it)
//   async_launches    empty launches queued back to back, then one wait
//   async_launch_queue_us
//                     the host CPU's time to queue one of them (what the
//                     driver's launch path costs the caller, and any wait
//                     for room in a full queue)
//   launch_queue_burst_us
//                     the same for bursts of 64 launches that fit in the
//                     queue (median of 20), each after the device is idle
//   h2d_16m, d2h_16m  pinned host <-> device copies of 16 MiB
//   h2d_64m           the same, 64 MiB
//   h2d_16m_async, d2h_16m_async, h2d_64m_async
//                     16 (64) MiB copies queued back to back on a stream
//                     (cudaMemcpyAsync), one wait, by the host's clock
//   h2d_16m_async_device, ...
//                     the same copies timed by events around them on the
//                     stream, as bandwidthTest times them
//   h2d_16m_async_queue_us
//                     the host CPU's time to queue one of those copies
//                     (what the copies cannot overlap when it is longer
//                     than the copy itself)
// Usage: bench_launch [ITERATIONS]
#define TEST_NAME "bench_launch"
#include "check.h"
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

__global__ void empty() {}

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double p50(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static double copy_gbs(void *dst, const void *src, size_t n, cudaMemcpyKind k, int reps) {
  CHECK(cudaMemcpy(dst, src, n, k));  // warm
  double t = now_us();
  for (int i = 0; i < reps; i++) CHECK(cudaMemcpy(dst, src, n, k));
  return (double)n * reps / ((now_us() - t) * 1e3);
}

// Queued copies timed two ways: by the host's clock from the first call
// to the end of the wait, and by events around them on the stream (as
// bandwidthTest times them), which leaves out the calls' own latency.
struct AsyncCopy {
  double wall_gbs, device_gbs, queue_us;
};

static AsyncCopy copy_async(void *dst, const void *src, size_t n, cudaMemcpyKind k, int reps,
                            cudaStream_t s) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaMemcpyAsync(dst, src, n, k, s));  // warm
  CHECK(cudaStreamSynchronize(s));
  double t = now_us();
  CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < reps; i++) CHECK(cudaMemcpyAsync(dst, src, n, k, s));
  AsyncCopy r;
  r.queue_us = (now_us() - t) / reps;
  CHECK(cudaEventRecord(b, s));
  CHECK(cudaStreamSynchronize(s));
  r.wall_gbs = (double)n * reps / ((now_us() - t) * 1e3);
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  r.device_gbs = (double)n * reps / (ms * 1e6);
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return r;
}

static void print_async(const char *name, const AsyncCopy &r) {
  printf("BENCH %s %.2f GB/s\n", name, r.wall_gbs);
  printf("BENCH %s_device %.2f GB/s\n", name, r.device_gbs);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 200;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  empty<<<1, 1, 0, s>>>();
  CHECK(cudaStreamSynchronize(s));
  std::vector<double> wall, dev;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < iters; i++) {
    double t = now_us();
    empty<<<1, 1, 0, s>>>();
    CHECK(cudaStreamSynchronize(s));
    wall.push_back(now_us() - t);
    CHECK(cudaEventRecord(a, s));
    empty<<<1, 1, 0, s>>>();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    dev.push_back(ms * 1e3);
  }
  printf("BENCH launch_sync_p50 %.1f us\n", p50(wall));
  printf("BENCH launch_device_p50 %.1f us\n", p50(dev));
  int n = iters * 10;
  double t = now_us();
  for (int i = 0; i < n; i++) empty<<<1, 1, 0, s>>>();
  double queued = now_us();
  CHECK(cudaStreamSynchronize(s));
  printf("BENCH async_launches %.0f per_s\n", n / ((now_us() - t) * 1e-6));
  printf("BENCH async_launch_queue_us %.2f us\n", (queued - t) / n);
  // Bursts short enough to fit in the device's queue, each after the
  // device went idle: the caller's cost of a launch without the wait a
  // full queue adds (which the figure above includes when the device is
  // the slower side).
  std::vector<double> burst;
  const int burst_n = 64;
  for (int r = 0; r < 20; r++) {
    double b0 = now_us();
    for (int i = 0; i < burst_n; i++) empty<<<1, 1, 0, s>>>();
    burst.push_back((now_us() - b0) / burst_n);
    CHECK(cudaStreamSynchronize(s));
  }
  printf("BENCH launch_queue_burst_us %.2f us\n", p50(burst));
  size_t big = 64 << 20;
  void *h, *d;
  CHECK(cudaMallocHost(&h, big));
  CHECK(cudaMalloc(&d, big));
  memset(h, 1, big);
  printf("BENCH h2d_16m %.2f GB/s\n", copy_gbs(d, h, 16 << 20, cudaMemcpyHostToDevice, 8));
  printf("BENCH d2h_16m %.2f GB/s\n", copy_gbs(h, d, 16 << 20, cudaMemcpyDeviceToHost, 8));
  printf("BENCH h2d_64m %.2f GB/s\n", copy_gbs(d, h, big, cudaMemcpyHostToDevice, 4));
  AsyncCopy up16 = copy_async(d, h, 16 << 20, cudaMemcpyHostToDevice, 16, s);
  print_async("h2d_16m_async", up16);
  printf("BENCH h2d_16m_async_queue_us %.1f us\n", up16.queue_us);
  print_async("h2d_64m_async", copy_async(d, h, big, cudaMemcpyHostToDevice, 8, s));
  // The asynchronous copies back land in the host's buffer by the wait.
  memset(h, 0, 16 << 20);
  print_async("d2h_16m_async", copy_async(h, d, 16 << 20, cudaMemcpyDeviceToHost, 16, s));
  for (size_t i = 0; i < (16 << 20); i++) {
    if (((unsigned char *)h)[i] != 1) {
      printf("FAIL %s byte %zu is %d after the copies back\n", TEST_NAME, i, ((unsigned char *)h)[i]);
      return 1;
    }
  }
  printf("PASS %s %d iterations\n", TEST_NAME, iters);
  return 0;
}
