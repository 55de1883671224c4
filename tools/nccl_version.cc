// Prints the version of the NCCL the Bazel build found (@local_cuda//:nccl), linked and
// called: `bazel run //:nccl_version`. ncclGetVersion needs no GPU.
#include <nccl.h>

#include <cstdio>

int main() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) {
    std::fprintf(stderr, "ncclGetVersion failed\n");
    return 1;
  }
  // Since NCCL 2.9 the code is major * 10000 + minor * 100 + patch.
  std::printf("NCCL %d.%d.%d\n", code / 10000, code / 100 % 100, code % 100);
  return 0;
}
