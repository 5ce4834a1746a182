// Memory workloads with known answers, for sysprof's memory tests and benchmarks.
//
//   memload touch N [MS]     maps N fresh pages (no huge pages) and writes one byte to each in
//                            touch_pages: N minor faults there; prints "ns_per_call=X" per page
//                            (the fault benchmark's timer); then holds them MS milliseconds
//   memload faultgo N MS     waits for a byte on stdin, then touches N fresh pages as touch
//                            does, and prints "minflt=X majflt=Y": its own faults over the
//                            touching, as getrusage counts them; then holds MS milliseconds
//   memload mmaps K SIZE     waits for a byte on stdin (so a trace can start first), then maps
//                            and unmaps SIZE bytes K times: K mmap and K munmap calls of SIZE
//   memload allocs N K       waits for a byte on stdin, then N rounds of allocate_known_sizes
//                            (malloc 1000, calloc 10 x 300, malloc 100 grown by realloc to 5000,
//                            all freed: 4 allocations, 9100 bytes, 4 frees a round), then K
//                            blocks of 4096 from keep_known_blocks, never freed
//   memload keepsmall K      waits for a byte on stdin, then K blocks of 16 bytes from
//                            keep_small_blocks, never freed
//   memload childallocs N    waits for a byte on stdin, then forks a child that waits 300 ms
//                            (a tracer sees it meanwhile) and does N rounds of
//                            allocate_known_sizes; the parent waits for it
//   memload mallocs N        N malloc/free pairs of 64 bytes; prints "ns_per_call=X" per pair
//                            (the heap benchmark's timer), and the tracer's BPF time per
//                            pair (parent_bpf.h)
//
// Build: cc -O1 -g -fno-omit-frame-pointer -o memload memload.c
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "parent_bpf.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// read(2) rather than stdio: stdio would allocate a buffer, and the allocation counts must be
// exactly the workload's.
static void wait_for_go(void) {
    char byte;
    if (read(0, &byte, 1) < 0) exit(3);
}

__attribute__((noinline)) void touch_pages(volatile char *pages, long count, long page) {
    for (long i = 0; i < count; i++) pages[i * page] = 1;
}

__attribute__((noinline)) void map_and_unmap(long times, size_t size) {
    for (long i = 0; i < times; i++) {
        char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) exit(4);
        munmap(p, size);
    }
}

// Each pointer goes through a volatile sink so the compiler keeps every call.
static void *volatile sink;

__attribute__((noinline)) void allocate_known_sizes(long rounds) {
    for (long i = 0; i < rounds; i++) {
        char *a = malloc(1000);
        char *b = calloc(10, 300);
        char *c = malloc(100);
        sink = a;
        sink = b;
        c = realloc(c, 5000);
        sink = c;
        free(a);
        free(b);
        free(c);
    }
}

__attribute__((noinline)) void keep_known_blocks(long count) {
    for (long i = 0; i < count; i++) {
        char *block = malloc(4096);
        block[0] = 1;
        sink = block;
    }
}

__attribute__((noinline)) void keep_small_blocks(long count) {
    for (long i = 0; i < count; i++) sink = malloc(16);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: memload touch N | mmaps K SIZE | allocs N K | mallocs N\n");
        return 2;
    }
    const char *mode = argv[1];
    long n = atol(argv[2]);
    long page = sysconf(_SC_PAGESIZE);
    if (strcmp(mode, "touch") == 0) {
        char *pages = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (pages == MAP_FAILED) return 4;
        // One fault per page: no transparent huge page may back several at once.
        madvise(pages, n * page, MADV_NOHUGEPAGE);
        double start = now();
        touch_pages(pages, n, page);
        printf("ns_per_call=%.1f\n", (now() - start) * 1e9 / n);
        fflush(stdout);
        if (argc >= 4) usleep(atol(argv[3]) * 1000);
        return 0;
    }
    if (strcmp(mode, "faultgo") == 0 && argc >= 4) {
        wait_for_go();
        struct rusage before, after;
        getrusage(RUSAGE_SELF, &before);
        char *pages = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (pages == MAP_FAILED) return 4;
        madvise(pages, n * page, MADV_NOHUGEPAGE);
        touch_pages(pages, n, page);
        getrusage(RUSAGE_SELF, &after);
        printf("minflt=%ld majflt=%ld\n", after.ru_minflt - before.ru_minflt, after.ru_majflt - before.ru_majflt);
        fflush(stdout);
        usleep(atol(argv[3]) * 1000);
        return 0;
    }
    if (strcmp(mode, "mmaps") == 0 && argc >= 4) {
        wait_for_go();
        map_and_unmap(n, (size_t)atol(argv[3]));
        return 0;
    }
    if (strcmp(mode, "allocs") == 0 && argc >= 4) {
        wait_for_go();
        allocate_known_sizes(n);
        keep_known_blocks(atol(argv[3]));
        return 0;
    }
    if (strcmp(mode, "keepsmall") == 0) {
        wait_for_go();
        keep_small_blocks(n);
        return 0;
    }
    if (strcmp(mode, "childallocs") == 0) {
        wait_for_go();
        pid_t child = fork();
        if (child == 0) {
            usleep(300 * 1000);
            allocate_known_sizes(n);
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 5;
    }
    if (strcmp(mode, "mallocs") == 0) {
        double start = now();
        for (long i = 0; i < n; i++) {
            sink = malloc(64);
            free(sink);
        }
        printf("ns_per_call=%.1f\n", (now() - start) * 1e9 / n);
        print_parent_bpf(n);
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
