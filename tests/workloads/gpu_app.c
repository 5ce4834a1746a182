// A program that uses the CUDA runtime and NCCL as a training job would, with known arguments,
// for sysprof's GPU tests. It links libcudart.so.12 and libnccl.so.2 by name: LD_LIBRARY_PATH
// picks NVIDIA's real libraries (no GPU here: every call fails, but its arguments are real) or
// the test doubles in tests/doubles (every call succeeds and takes a known time).
//
//   gpu_app api       one call of each kind, known sizes; prints each return code
//   gpu_app success   allocations, pinned and pageable copies, synchronizations and all-reduces
//                     (the test doubles' success paths)
//   gpu_app redundant a 2 MiB pinned input copied to the device 5 times from
//                     upload_constant_input and never freed on either side; a 1 MiB heap buffer
//                     copied once then freed on the host; a 512 KiB heap buffer copied once and
//                     kept (with the test doubles)
//   gpu_app pageable N   N host-to-device copies of 1 MiB from pageable memory in load_batch (with
//                        the test doubles: 1 GB/s, about N ms); prints "ns_per_call=X" per copy
//                        (and with WORKLOAD_BPF_TIME=1, "bpf_ns_per_call=X", parent_bpf.h)
//   gpu_app syncs N      N launches, each followed by a cudaDeviceSynchronize in step (with the
//                        test doubles: 2 ms per synchronize)
//   gpu_app collectives N MS   N rounds of MS ms of CPU work in compute_step, then an all-reduce:
//                        a rank of a data-parallel job (a larger MS: a straggler)
//
// Build: cc -O1 -g -fno-omit-frame-pointer -o gpu_app gpu_app.c -L DIR -l:libcudart.so.12 -l:libnccl.so.2
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "parent_bpf.h"

// Stands for a kernel's host stub, the pointer cudaLaunchKernel receives.
__attribute__((noinline)) void vector_add_kernel_stub(void) { __asm__ volatile(""); }

static char pageable[1 << 21];

#define REPORT(name, call) printf("%s=%d\n", name, (int)(call))

__attribute__((noinline)) static void api_calls(void) {
    void *dev = NULL, *pinned = NULL;
    REPORT("cudaMalloc", cudaMalloc(&dev, 1 << 20));
    REPORT("cudaMallocHost", cudaMallocHost(&pinned, 65536));
    REPORT("cudaSetDevice", cudaSetDevice(1));
    REPORT("cudaMemcpyH2D", cudaMemcpy(dev, pageable, 4096, cudaMemcpyHostToDevice));
    REPORT("cudaMemcpyH2D", cudaMemcpy(dev, pinned, 8192, cudaMemcpyHostToDevice));
    REPORT("cudaMemcpyD2H", cudaMemcpy(pageable, dev, 12288, cudaMemcpyDeviceToHost));
    REPORT("cudaMemcpyD2D", cudaMemcpy(dev, dev, 16384, cudaMemcpyDeviceToDevice));
    REPORT("cudaMemcpyH2H", cudaMemcpy(pageable, pageable + 65536, 20480, cudaMemcpyHostToHost));
    REPORT("cudaMemcpyAsync", cudaMemcpyAsync(dev, pageable, 24576, cudaMemcpyHostToDevice, NULL));
    REPORT("cudaMemcpy2D", cudaMemcpy2D(dev, 128, pageable, 128, 64, 32, cudaMemcpyHostToDevice));
    struct cudaMemcpy3DParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr.ptr = pageable;
    p.dstPtr.ptr = dev;
    p.extent.width = 16;
    p.extent.height = 8;
    p.extent.depth = 4;
    p.kind = cudaMemcpyHostToDevice;
    REPORT("cudaMemcpy3D", cudaMemcpy3D(&p));
    REPORT("cudaMemset", cudaMemset(dev, 0, 3000));
    dim3 grid = {64, 1, 1}, block = {256, 1, 1};
    for (int i = 0; i < 5; i++)
        REPORT("cudaLaunchKernel", cudaLaunchKernel((void *)vector_add_kernel_stub, grid, block, NULL, 0, NULL));
    for (int i = 0; i < 3; i++) REPORT("cudaDeviceSynchronize", cudaDeviceSynchronize());
    REPORT("cudaFree", cudaFree(dev));
    REPORT("ncclAllReduce", ncclAllReduce(pageable, pageable, 1024, ncclFloat32, ncclSum, NULL, NULL));
    REPORT("ncclBroadcast", ncclBroadcast(pageable, pageable, 256, ncclInt8, 0, NULL, NULL));
    REPORT("ncclAllGather", ncclAllGather(pageable, pageable, 512, ncclFloat16, NULL, NULL));
    REPORT("ncclReduceScatter", ncclReduceScatter(pageable, pageable, 128, ncclFloat64, ncclSum, NULL, NULL));
    REPORT("ncclGroupStart", ncclGroupStart());
    REPORT("ncclSend", ncclSend(pageable, 100, ncclInt32, 1, NULL, NULL));
    REPORT("ncclRecv", ncclRecv(pageable, 100, ncclInt32, 1, NULL, NULL));
    REPORT("ncclGroupEnd", ncclGroupEnd());
}

__attribute__((noinline)) static void training_step(void *dev, void *pinned, ncclComm_t comm) {
    // Two pinned copies and one pageable copy of 1 MiB per step, then an all-reduce of 8 MiB.
    cudaMemcpy(dev, pinned, 1 << 20, cudaMemcpyHostToDevice);
    cudaMemcpy(dev, pinned, 1 << 20, cudaMemcpyHostToDevice);
    cudaMemcpy(dev, pageable, 1 << 20, cudaMemcpyHostToDevice);
    ncclAllReduce(dev, dev, 2 << 20, ncclFloat32, ncclSum, comm, NULL);
    cudaStreamSynchronize(NULL);
}

__attribute__((noinline)) static void success_paths(void) {
    void *dev = NULL, *leaked = NULL, *pinned = NULL;
    cudaSetDevice(1);
    REPORT("cudaMalloc", cudaMalloc(&dev, 64 << 20));
    REPORT("cudaMalloc", cudaMalloc(&leaked, 3 << 20));
    REPORT("cudaMallocHost", cudaMallocHost(&pinned, 4 << 20));
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    REPORT("ncclCommInitRank", ncclCommInitRank(&comm, 4, id, 1));
    for (int step = 0; step < 10; step++) training_step(dev, pinned, comm);
    cudaFree(dev);
    cudaFreeHost(pinned);
}

__attribute__((noinline)) static void upload_constant_input(void *dev, const void *host) {
    cudaMemcpy(dev, host, 2 << 20, cudaMemcpyHostToDevice);
}

__attribute__((noinline)) static void redundant_copies(void) {
    void *weights = NULL, *pinned = NULL, *dev_staged = NULL, *dev_kept = NULL;
    cudaSetDevice(0);
    REPORT("cudaMalloc", cudaMalloc(&weights, 2 << 20));
    REPORT("cudaMallocHost", cudaMallocHost(&pinned, 2 << 20));
    memset(pinned, 1, 2 << 20);
    for (int i = 0; i < 5; i++) upload_constant_input(weights, pinned);
    char *staging = malloc(1 << 20);
    memset(staging, 2, 1 << 20);
    REPORT("cudaMalloc", cudaMalloc(&dev_staged, 1 << 20));
    cudaMemcpy(dev_staged, staging, 1 << 20, cudaMemcpyHostToDevice);
    free(staging);
    char *kept = malloc(512 << 10);
    memset(kept, 3, 512 << 10);
    REPORT("cudaMalloc", cudaMalloc(&dev_kept, 512 << 10));
    cudaMemcpy(dev_kept, kept, 512 << 10, cudaMemcpyHostToDevice);
}

__attribute__((noinline)) static void load_batch(void *dev) {
    cudaMemcpy(dev, pageable, 1 << 20, cudaMemcpyHostToDevice);
}

__attribute__((noinline)) static void step(void) {
    dim3 grid = {64, 1, 1}, block = {256, 1, 1};
    cudaLaunchKernel((void *)vector_add_kernel_stub, grid, block, NULL, 0, NULL);
    cudaDeviceSynchronize();
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static volatile unsigned long work_sink;

// Burns MS milliseconds of wall time on the CPU: one step's forward and backward pass.
__attribute__((noinline)) static void compute_step(long ms) {
    double until = seconds_now() + ms / 1e3;
    while (seconds_now() < until) work_sink++;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "api") == 0) {
        api_calls();
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "success") == 0) {
        success_paths();
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "pageable") == 0) {
        void *dev = NULL;
        cudaMalloc(&dev, 1 << 20);
        long n = atol(argv[2]);
        double start = seconds_now();
        for (long i = 0; i < n; i++) load_batch(dev);
        // The loop's own time a copy, for `cargo xtask bench gpu-calls`.
        if (n > 0) printf("ns_per_call=%.1f\n", (seconds_now() - start) * 1e9 / n);
        print_parent_bpf(n);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "syncs") == 0) {
        for (long i = 0, n = atol(argv[2]); i < n; i++) step();
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "collectives") == 0) {
        long rounds = atol(argv[2]), ms = atol(argv[3]);
        for (long i = 0; i < rounds; i++) {
            compute_step(ms);
            ncclAllReduce(pageable, pageable, 1 << 16, ncclFloat32, ncclSum, NULL, NULL);
        }
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "redundant") == 0) {
        redundant_copies();
        return 0;
    }
    fprintf(stderr, "usage: gpu_app api|success|redundant|pageable N|syncs N|collectives N MS\n");
    return 2;
}
