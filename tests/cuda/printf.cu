// printf in kernels: what each thread prints reaches the program's
// standard output by the next synchronisation (or cudaDeviceReset),
// formatted as C's printf formats it, in order with the program's own
// output around it. The
// program sends its standard output to a file for a while and reads it
// back.
#define TEST_NAME "printf"
#include "check.h"

#include <string>
#include <vector>
#include <algorithm>
#include <unistd.h>

__device__ const char kWord[] = "device-string";

__global__ void hello(int value, double x) {
  printf("block %d thread %d: value=%d x=%.3f s=%s c=%c hex=%#x e=%.2e pad=[%5d|%-4d] ll=%lld\n",
         blockIdx.x, threadIdx.x, value, x, kWord, 'A' + threadIdx.x, 255 + threadIdx.x, 12345.678,
         threadIdx.x, blockIdx.x, -1234567890123LL);
}

__global__ void quiet(int *out) { out[threadIdx.x] = threadIdx.x; }

__global__ void count(int n) {
  if (threadIdx.x < n) printf("line %d\n", threadIdx.x);
}

// Everything printed to stdout between start() and the returned text.
struct Capture {
  int saved = -1;
  FILE *file = nullptr;
  void start() {
    fflush(stdout);
    file = tmpfile();
    EXPECT(file != nullptr, "no temporary file");
    saved = dup(1);
    dup2(fileno(file), 1);
  }
  std::string stop() {
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    std::string text;
    rewind(file);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, file)) > 0) text.append(buf, n);
    fclose(file);
    return text;
  }
};

static std::vector<std::string> lines(const std::string &text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

int main() {
  int *d;
  CHECK(cudaMalloc(&d, 64 * sizeof(int)));

  // Formatting, and order with the program's own printf.
  Capture c;
  c.start();
  printf("host before\n");
  hello<<<2, 3>>>(42, 1.5);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  printf("host after\n");
  std::string text = c.stop();
  std::vector<std::string> got = lines(text);
  EXPECT(got.size() == 8, "%zu lines printed, 8 expected:\n%s", got.size(), text.c_str());
  EXPECT(got.front() == "host before" && got.back() == "host after",
         "the kernel's lines are not between the program's own:\n%s", text.c_str());
  std::vector<std::string> kernel(got.begin() + 1, got.end() - 1);
  std::vector<std::string> want;
  for (int b = 0; b < 2; b++) {
    for (int t = 0; t < 3; t++) {
      char line[256];
      snprintf(line, sizeof line,
               "block %d thread %d: value=%d x=%.3f s=%s c=%c hex=%#x e=%.2e pad=[%5d|%-4d] ll=%lld", b, t,
               42, 1.5, "device-string", 'A' + t, 255 + t, 12345.678, t, b, -1234567890123LL);
      want.push_back(line);
    }
  }
  std::sort(kernel.begin(), kernel.end());
  std::sort(want.begin(), want.end());
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT(kernel[i] == want[i], "printed \"%s\", expected \"%s\"", kernel[i].c_str(), want[i].c_str());
  }
  printf("PASS %s-format 6 threads' lines as C formats them, between the program's own\n", TEST_NAME);

  // A kernel that prints nothing prints nothing; output waits for a
  // synchronisation and comes once.
  c.start();
  quiet<<<1, 32>>>(d);
  count<<<1, 32>>>(5);
  CHECK(cudaStreamSynchronize(0));
  CHECK(cudaDeviceSynchronize());
  text = c.stop();
  got = lines(text);
  std::sort(got.begin(), got.end());
  EXPECT(got.size() == 5, "%zu lines after a stream sync, 5 expected:\n%s", got.size(), text.c_str());
  for (int i = 0; i < 5; i++) {
    char line[32];
    snprintf(line, sizeof line, "line %d", i);
    EXPECT(got[i] == line, "line %d is \"%s\"", i, got[i].c_str());
  }

  // A blocking copy flushes too.
  c.start();
  count<<<1, 32>>>(3);
  int host[64];
  CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
  text = c.stop();
  EXPECT(lines(text).size() == 3, "%zu lines after a blocking copy, 3 expected:\n%s", lines(text).size(),
         text.c_str());
  EXPECT(host[31] == 31, "the quiet kernel wrote %d", host[31]);
  printf("PASS %s-sync output at a stream sync and at a blocking copy, once\n", TEST_NAME);

  CHECK(cudaFree(d));

  // The samples' hello world: launch, then cudaDeviceReset, no
  // synchronisation; the reset waits for the kernel and prints.
  c.start();
  count<<<1, 32>>>(4);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceReset());
  text = c.stop();
  EXPECT(lines(text).size() == 4, "%zu lines after cudaDeviceReset, 4 expected:\n%s", lines(text).size(),
         text.c_str());
  printf("PASS %s-reset output of a kernel left running at cudaDeviceReset\n", TEST_NAME);
  return 0;
}
