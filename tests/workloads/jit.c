// Code in anonymous executable memory, as a JIT puts it there: what sysprof names through the
// runtime's perf map (/tmp/perf-PID.map), and what it does when that file is hostile.
//
//   jit SECONDS [map]   copy a spin loop into an anonymous executable mapping and call it for
//                       SECONDS (default 5); with "map", first write /tmp/perf-PID.map naming
//                       it jit_spin_loop, as a JIT does. Prints "ready" when it starts calling.
//
// x86-64 only (the loop is machine code).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// mov ecx, 0x100000; 1: dec ecx; jnz 1b; ret
static const unsigned char spin[] = {0xb9, 0x00, 0x00, 0x10, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0xc3};

__attribute__((noinline)) void jit_caller(void (*code)(void)) {
    code();
    __asm__ volatile("" ::: "memory");
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
#if !defined(__x86_64__)
    fprintf(stderr, "jit: x86-64 only\n");
    return 2;
#endif
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    unsigned char *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) return 1;
    memcpy(code, spin, sizeof spin);
    if (mprotect(code, 4096, PROT_READ | PROT_EXEC) != 0) return 1;
    if (argc > 2 && strcmp(argv[2], "map") == 0) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
        FILE *map = fopen(path, "w");
        if (!map) return 1;
        fchmod(fileno(map), 0644);
        fprintf(map, "%lx %zx jit_spin_loop\n", (unsigned long)code, sizeof spin);
        fclose(map);
    }
    printf("ready\n");
    fflush(stdout);
    double end = now() + seconds;
    while (now() < end) jit_caller((void (*)(void))code);
    return 0;
}
