// A program that works in named functions, then exec()s: what sysprof must keep apart is the
// image each sample ran in.
//
//   execer [--wait] SECONDS PROGRAM [ARGS...]
//       burn SECONDS of its own CPU time, 50% in exec_alpha, 30% in exec_beta, 20% in
//       exec_gamma, print "alpha_ns=N beta_ns=N gamma_ns=N" (each function's CPU time, by the
//       thread's own clock), then exec PROGRAM ARGS
//   execer [--wait] SECONDS --self AFTER_SECONDS
//       as above, then exec itself (its own path) as `execer --after AFTER_SECONDS`: the same
//       file, under the same name, as a second image at other addresses
//   execer --after SECONDS
//       burn SECONDS of CPU time in after_exec_spin, then print "after_ns=N"
//
// --wait: read one byte from stdin first (a test attaches to the process meanwhile).
//
// Build with frame pointers so user stacks are complete:
//   cc -O1 -g -fno-omit-frame-pointer -o execer execer.c
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;

// Called at the end of each burner so that none is a leaf function: GCC drops the frame
// pointer of leaf functions even with -fno-omit-frame-pointer, which hides their caller.
__attribute__((noinline)) void checkpoint(void) { __asm__ volatile("" ::: "memory"); }

#define BURN(units)                                                   \
    for (uint64_t i = 0; i < (units) * 20000ULL; i++) {               \
        sink = sink * 6364136223846793005ULL + i;                     \
    }                                                                 \
    checkpoint();

__attribute__((noinline)) void exec_alpha(uint64_t units) { BURN(units) }
__attribute__((noinline)) void exec_beta(uint64_t units) { BURN(units) }
__attribute__((noinline)) void exec_gamma(uint64_t units) { BURN(units) }
__attribute__((noinline)) void after_exec_spin(uint64_t units) { BURN(units) }

static uint64_t cpu_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

// Runs `work(units)` and adds the CPU time it took to `*spent`.
static void timed(void (*work)(uint64_t), uint64_t units, uint64_t *spent) {
    uint64_t start = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    work(units);
    *spent += cpu_ns(CLOCK_THREAD_CPUTIME_ID) - start;
}

__attribute__((noinline)) static void before_exec(double seconds) {
    uint64_t alpha = 0, beta = 0, gamma = 0;
    uint64_t end = cpu_ns(CLOCK_PROCESS_CPUTIME_ID) + (uint64_t)(seconds * 1e9);
    while (cpu_ns(CLOCK_PROCESS_CPUTIME_ID) < end) {
        timed(exec_alpha, 5, &alpha);
        timed(exec_beta, 3, &beta);
        timed(exec_gamma, 2, &gamma);
    }
    printf("alpha_ns=%llu beta_ns=%llu gamma_ns=%llu\n", (unsigned long long)alpha,
           (unsigned long long)beta, (unsigned long long)gamma);
    fflush(stdout);
}

__attribute__((noinline)) static void after_exec(double seconds) {
    uint64_t spent = 0;
    uint64_t end = cpu_ns(CLOCK_PROCESS_CPUTIME_ID) + (uint64_t)(seconds * 1e9);
    while (cpu_ns(CLOCK_PROCESS_CPUTIME_ID) < end) {
        timed(after_exec_spin, 5, &spent);
    }
    printf("after_ns=%llu\n", (unsigned long long)spent);
    fflush(stdout);
}

static void usage(void) {
    fprintf(stderr, "usage: execer [--wait] SECONDS (PROGRAM [ARGS...] | --self AFTER_SECONDS)\n"
                    "       execer --after SECONDS\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--after") == 0) {
        after_exec(atof(argv[2]));
        return 0;
    }
    int arg = 1;
    if (arg < argc && strcmp(argv[arg], "--wait") == 0) {
        char byte;
        if (read(0, &byte, 1) != 1) {
            return 1;
        }
        arg++;
    }
    if (argc - arg < 2) {
        usage();
    }
    before_exec(atof(argv[arg]));
    char **next = &argv[arg + 1];
    if (strcmp(next[0], "--self") == 0) {
        if (argc - arg != 3) {
            usage();
        }
        // By its own path, so the second image has the first's name too.
        static char path[4096];
        ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
        if (length <= 0) {
            perror("execer: /proc/self/exe");
            return 127;
        }
        path[length] = 0;
        char *self[] = {argv[0], "--after", next[1], NULL};
        execv(path, self);
    } else {
        execvp(next[0], next);
    }
    perror("execer: exec");
    return 127;
}
