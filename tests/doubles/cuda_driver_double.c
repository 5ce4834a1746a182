// TEST DOUBLE of the CUDA driver (libcuda.so.1): see README.md. Not NVIDIA code.
#include <stddef.h>
#include <stdint.h>
#include <time.h>

int cuMemcpy(uint64_t dst, uint64_t src, size_t count) {
    (void)dst; (void)src;
    // A copy moves one byte per nanosecond: 1 GB/s.
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((size_t)((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec)) < count);
    return 0;
}
