// A vGPU holds at most its limit of contexts at once, one per process
// (vgpud's `contexts`, which the argument gives): processes past it get
// cudaErrorMemoryAllocation from their first allocation, as from a GPU
// whose memory is full, and nothing worse; once one of the others exits,
// a new process gets a context again. Without an argument (or 0: a vGPU
// without contexts) there is nothing to check.
#define TEST_NAME "context_limit"
#include "check.h"
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

struct Child {
  pid_t pid;
  int told;  // closed: the child exits
  int code;  // what its cudaMalloc returned
};

// The write ends of the children's pipes, which no other child may keep
// open (or closing one would not end its child).
static std::vector<int> told_fds;

// A process that allocates (making its context), says what it got and
// holds on until its pipe closes. The parent never initialises CUDA.
static Child spawn() {
  int answer[2], hold[2];
  if (pipe(answer) != 0 || pipe(hold) != 0) {
    printf("FAIL %s: pipe\n", TEST_NAME);
    exit(1);
  }
  pid_t pid = fork();
  if (pid < 0) {
    printf("FAIL %s: fork\n", TEST_NAME);
    exit(1);
  }
  if (pid == 0) {
    close(answer[0]);
    close(hold[1]);
    for (int fd : told_fds) close(fd);
    void *p = nullptr;
    int code = (int)cudaMalloc(&p, 4096);
    if (write(answer[1], &code, sizeof code) != (ssize_t)sizeof code) _exit(2);
    char c;
    while (read(hold[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(answer[1]);
  close(hold[0]);
  Child k = {pid, hold[1], -1};
  told_fds.push_back(hold[1]);
  if (read(answer[0], &k.code, sizeof k.code) != (ssize_t)sizeof k.code) k.code = -1;
  close(answer[0]);
  return k;
}

// Lets the child go; its exit status.
static int release(Child &k) {
  close(k.told);
  for (size_t i = 0; i < told_fds.size(); i++) {
    if (told_fds[i] == k.told) {
      told_fds.erase(told_fds.begin() + i);
      break;
    }
  }
  int st = 0;
  waitpid(k.pid, &st, 0);
  return st;
}

int main(int argc, char **argv) {
  const int max = argc > 1 ? atoi(argv[1]) : 0;
  if (max <= 0) {
    printf("PASS %s: skipped, the vGPU has no contexts\n", TEST_NAME);
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);
  std::vector<Child> held;
  Child refused = {-1, -1, -1};
  // Other processes may hold contexts too: the refusal comes at the
  // latest with the (max + 1)th.
  for (int i = 0; i <= max; i++) {
    Child k = spawn();
    if (k.code != (int)cudaSuccess) {
      refused = k;
      break;
    }
    held.push_back(k);
  }
  int ok = 1;
  if (refused.pid < 0) {
    printf("FAIL %s: %d processes got a context, the limit is %d\n", TEST_NAME, max + 1, max);
    ok = 0;
  } else if (refused.code != (int)cudaErrorMemoryAllocation) {
    printf("FAIL %s: the process past the limit got %s (%d), not cudaErrorMemoryAllocation\n",
           TEST_NAME, refused.code < 0 ? "nothing" : cudaGetErrorName((cudaError_t)refused.code),
           refused.code);
    ok = 0;
  } else if (held.empty()) {
    printf("FAIL %s: no process got a context\n", TEST_NAME);
    ok = 0;
  }
  if (refused.pid >= 0) {
    int st = release(refused);
    if (ok && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      printf("FAIL %s: the refused process ended with status %#x\n", TEST_NAME, st);
      ok = 0;
    }
  }
  // One context ends: the next process gets it.
  int again = -1;
  if (ok) {
    release(held.back());
    held.pop_back();
    Child k = spawn();
    again = k.code;
    held.push_back(k);
    if (again != (int)cudaSuccess) {
      printf("FAIL %s: after a context ended, a new process got %s (%d)\n", TEST_NAME,
             again < 0 ? "nothing" : cudaGetErrorName((cudaError_t)again), again);
      ok = 0;
    }
  }
  size_t n = held.size();
  for (auto &k : held) release(k);
  if (!ok) return 1;
  printf("PASS %s: %zu processes held a context, the next got cudaErrorMemoryAllocation; after one "
         "ended, a new one got a context (limit %d)\n",
         TEST_NAME, n, max);
  return 0;
}
