// The nccl-tests launch loop as a function that Python calls once through ctypes, in the same process and on the
// same communicator as meshscale's --impl nccl (benchmarks/experiments/python_vs_c_launch.py). Tells apart what a Python-driven
// call costs from what the process (torch, its CUDA context, a second NCCL communicator) costs.
//   gcc -O2 -shared -fPIC -o /tmp/libnccl_loop.so benchmarks/experiments/nccl_loop_lib.c -L$NCCL_LIB -l:libnccl.so.2
#include <stddef.h>
int ncclAllReduce(const void *s, void *r, size_t n, int type, int op, void *comm, void *stream);

int allreduce_loop(const void *s, void *r, size_t n, void *comm, void *stream, int iters) {
  for (int i = 0; i < iters; i++) {
    int err = ncclAllReduce(s, r, n, 7 /* float32 */, 0 /* sum */, comm, stream);
    if (err) return err;
  }
  return 0;
}
