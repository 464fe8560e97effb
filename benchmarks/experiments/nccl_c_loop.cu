// Small-message time of NCCL collectives from a C launch loop, in nccl-tests' two launch configurations:
//   threads: ONE process and thread drives all GPUs (nccl-tests -g N, how the reference in reference/ was run):
//            per iteration ncclGroupStart, one call per GPU, ncclGroupEnd;
//   procs:   one process per GPU (nccl-tests under MPI, and meshscale's layout): each enqueues only its own call.
// Timing as nccl-tests: 5 warm-up iterations, barrier, host clock around 20 iterations and a stream sync; the
// procs figure is the mean over ranks (its -a 1). Float32, sum, 1 KiB..1 MiB by 4. Tells apart what the launch
// configuration costs from what meshscale's Python adds (compare with `bench collective --impl nccl`).
//   nvcc -O2 -o /tmp/nccl_c_loop benchmarks/experiments/nccl_c_loop.cu -L$NCCL_LIB -l:libnccl.so.2 -Xlinker -rpath=$NCCL_LIB
//   /tmp/nccl_c_loop threads|procs NGPUS     (NGPUS given: the parent must not touch CUDA before it forks)
// NCCL's prototypes are declared here (the pip wheel of NCCL that torch uses may ship no header).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern "C" {
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
int ncclGetUniqueId(ncclUniqueId *id);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
int ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
int ncclCommDestroy(ncclComm_t comm);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclAllReduce(const void *s, void *r, size_t n, int type, int op, ncclComm_t c, cudaStream_t st);
int ncclAllGather(const void *s, void *r, size_t n, int type, ncclComm_t c, cudaStream_t st);
int ncclReduceScatter(const void *s, void *r, size_t n, int type, int op, ncclComm_t c, cudaStream_t st);
int ncclBroadcast(const void *s, void *r, size_t n, int type, int root, ncclComm_t c, cudaStream_t st);
int ncclSend(const void *s, size_t n, int type, int peer, ncclComm_t c, cudaStream_t st);
int ncclRecv(void *r, size_t n, int type, int peer, ncclComm_t c, cudaStream_t st);
}
enum { FLOAT = 7, SUM = 0, MAXG = 8, WARMUP = 5, ITERS = 20 };
static const char *NAMES[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"};

struct Rank { ncclComm_t comm; cudaStream_t stream; float *in, *out; int rank, n, dev; };

// one collective of `bytes` (nccl-tests' size) on one rank, enqueued on its stream
static void call(int coll, size_t bytes, Rank *r) {
  size_t count = bytes / 4, chunk = count / r->n;
  switch (coll) {
    case 0: ncclAllReduce(r->in, r->in, count, FLOAT, SUM, r->comm, r->stream); break;
    case 1: ncclAllGather(r->in, r->out, chunk, FLOAT, r->comm, r->stream); break;
    case 2: ncclReduceScatter(r->in, r->out, chunk, FLOAT, SUM, r->comm, r->stream); break;
    case 3: ncclBroadcast(r->in, r->in, count, FLOAT, 0, r->comm, r->stream); break;
    case 4:
      ncclGroupStart();
      for (int p = 0; p < r->n; p++) {
        ncclSend(r->in + p * chunk, chunk, FLOAT, p, r->comm, r->stream);
        ncclRecv(r->out + p * chunk, chunk, FLOAT, p, r->comm, r->stream);
      }
      ncclGroupEnd();
      break;
    case 5:
      ncclGroupStart();
      ncclSend(r->in, count, FLOAT, (r->rank + 1) % r->n, r->comm, r->stream);
      ncclRecv(r->out, count, FLOAT, (r->rank + r->n - 1) % r->n, r->comm, r->stream);
      ncclGroupEnd();
      break;
  }
}

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void alloc(Rank *r, int dev, int rank, int n) {
  r->dev = dev; r->rank = rank; r->n = n;
  cudaSetDevice(dev);
  cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking);
  cudaMalloc(&r->in, 1 << 20);
  cudaMalloc(&r->out, 1 << 20);
  cudaMemset(r->in, 0, 1 << 20);
}

// per-process barrier in shared memory (sense-reversing)
struct Shared { volatile int count, sense; ncclUniqueId id; volatile int id_ready; double us[MAXG]; };
static void barrier(Shared *s, int n, int *local_sense) {
  *local_sense = !*local_sense;
  if (__sync_add_and_fetch(&s->count, 1) == n) { s->count = 0; __sync_synchronize(); s->sense = *local_sense; }
  else while (s->sense != *local_sense) {}
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "threads";
  int n = argc > 2 ? atoi(argv[2]) : 0;
  if (n < 2 || n > MAXG) { fprintf(stderr, "needs 2..%d GPUs\n", MAXG); return 2; }
  if (!strcmp(mode, "threads")) {
    Rank r[MAXG]; ncclComm_t comms[MAXG]; int devs[MAXG];
    for (int i = 0; i < n; i++) devs[i] = i;
    if (ncclCommInitAll(comms, n, devs)) { fprintf(stderr, "ncclCommInitAll failed\n"); return 1; }
    for (int i = 0; i < n; i++) { alloc(&r[i], i, i, n); r[i].comm = comms[i]; }
    for (int coll = 0; coll < 6; coll++)
      for (size_t bytes = 1024; bytes <= (1 << 20); bytes *= 4) {
        double t0 = 0;
        for (int it = 0; it < WARMUP + ITERS; it++) {
          if (it == WARMUP) { for (int i = 0; i < n; i++) cudaStreamSynchronize(r[i].stream); t0 = now(); }
          ncclGroupStart();
          for (int i = 0; i < n; i++) call(coll, bytes, &r[i]);
          ncclGroupEnd();
        }
        for (int i = 0; i < n; i++) cudaStreamSynchronize(r[i].stream);
        printf("threads %-15s %8zu %8.2f us\n", NAMES[coll], bytes, (now() - t0) / ITERS * 1e6);
      }
    for (int i = 0; i < n; i++) ncclCommDestroy(comms[i]);
    return 0;
  }
  Shared *s = (Shared *)mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(s, 0, sizeof(Shared));
  for (int rank = 0; rank < n; rank++) {
    if (fork() != 0) continue;
    int sense = 0; Rank r;
    if (rank == 0) { ncclGetUniqueId(&s->id); __sync_synchronize(); s->id_ready = 1; }
    while (!s->id_ready) {}
    alloc(&r, rank, rank, n);
    if (ncclCommInitRank(&r.comm, n, s->id, rank)) { fprintf(stderr, "ncclCommInitRank failed\n"); _exit(1); }
    for (int coll = 0; coll < 6; coll++)
      for (size_t bytes = 1024; bytes <= (1 << 20); bytes *= 4) {
        for (int it = 0; it < WARMUP; it++) call(coll, bytes, &r);
        cudaStreamSynchronize(r.stream);
        barrier(s, n, &sense);
        double t0 = now();
        for (int it = 0; it < ITERS; it++) call(coll, bytes, &r);
        cudaStreamSynchronize(r.stream);
        s->us[rank] = (now() - t0) / ITERS * 1e6;
        barrier(s, n, &sense);
        if (rank == 0) {
          double mean = 0;
          for (int i = 0; i < n; i++) mean += s->us[i] / n;
          printf("procs   %-15s %8zu %8.2f us\n", NAMES[coll], bytes, mean);
          fflush(stdout);
        }
        barrier(s, n, &sense);
      }
    ncclCommDestroy(r.comm);
    _exit(0);
  }
  int status, failed = 0;
  while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status);
  return failed;
}
