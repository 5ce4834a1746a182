// TEST DOUBLE of the CUDA runtime (libcudart.so.12): see README.md. Not NVIDIA code.
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "../workloads/cuda_api.h"

int cuMemcpy(uint64_t dst, uint64_t src, size_t count);

static uint64_t next_device_address = 0x7e0000000000ULL;

static void spin_ns(long ns) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < ns);
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
    *ptr = (void *)next_device_address;
    next_device_address += (size + 0xfff) & ~0xfffULL;
    return 0;
}
cudaError_t cudaMallocHost(void **ptr, size_t size) { *ptr = malloc(size); return *ptr ? 0 : 2; }
cudaError_t cudaFree(void *ptr) { (void)ptr; return 0; }
cudaError_t cudaFreeHost(void *ptr) { free(ptr); return 0; }
cudaError_t cudaSetDevice(int device) { (void)device; return 0; }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind) {
    (void)kind;
    return cuMemcpy((uint64_t)dst, (uint64_t)src, count);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t s) {
    (void)dst; (void)src; (void)count; (void)kind; (void)s;
    return 0;
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, int kind) {
    (void)dpitch; (void)spitch; (void)kind;
    return cuMemcpy((uint64_t)dst, (uint64_t)src, width * height);
}
cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms *p) {
    return cuMemcpy((uint64_t)p->dstPtr.ptr, (uint64_t)p->srcPtr.ptr,
                    p->extent.width * p->extent.height * p->extent.depth);
}
cudaError_t cudaMemset(void *ptr, int value, size_t count) { (void)ptr; (void)value; spin_ns(count); return 0; }
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                             cudaStream_t stream) {
    (void)func; (void)grid; (void)block; (void)args; (void)shared; (void)stream;
    spin_ns(5000);
    return 0;
}
cudaError_t cudaDeviceSynchronize(void) { spin_ns(2000000); return 0; }
cudaError_t cudaStreamSynchronize(cudaStream_t stream) { (void)stream; spin_ns(2000000); return 0; }

// Exported for the tests of the driver path through the runtime.
void cudart_double_spin_ns(long ns) { spin_ns(ns); }
