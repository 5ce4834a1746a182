// A CPU-bound workload with known shares, for sysprof's tests and examples.
//
// Each round calls burn_hot for 3 units of work and burn_cold for 1 unit of the same work, so
// burn_hot takes 75% of the CPU time and burn_cold 25%.
//
//   busy [SECONDS] [THREADS]      burn for SECONDS (default 5) on THREADS threads (default 1),
//                                 then print "cpu_ns=N": the CPU time the process got (on a
//                                 busy machine, less than SECONDS x THREADS)
//   busy --spawn-child SECONDS    as above on one thread, and after 0.3 s run a short-lived
//                                 child process (busy --child) that burns in child_only_work
//   busy --child SECONDS          burn in child_only_work, then print "child_cpu_ns=N" (the CPU
//                                 time it got, which a busy machine makes less than SECONDS)
//                                 and exit
//   busy --work ROUNDS [THREADS]  a fixed amount of work (ROUNDS rounds per thread), then print
//                                 "elapsed_ns=N" (the benchmark's timer: the workload times
//                                 itself, so a profiler's start-up is not counted)
//
// Build with frame pointers so user stacks are complete:
//   cc -O1 -g -fno-omit-frame-pointer -pthread -o busy busy.c
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;

// Called at the end of each burner so that none is a leaf function: GCC drops the frame
// pointer of leaf functions even with -fno-omit-frame-pointer, which hides their caller.
__attribute__((noinline)) void checkpoint(void) { __asm__ volatile("" ::: "memory"); }

// The same loop in every burner, so time is proportional to units of work.
#define BURN(units)                                                   \
    for (uint64_t i = 0; i < (units) * 20000ULL; i++) {               \
        sink = sink * 6364136223846793005ULL + i;                     \
    }                                                                 \
    checkpoint();

__attribute__((noinline)) void burn_hot(uint64_t units) { BURN(units) }
__attribute__((noinline)) void burn_cold(uint64_t units) { BURN(units) }
__attribute__((noinline)) void child_only_work(uint64_t units) { BURN(units) }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void burn_for(double seconds) {
    double end = now() + seconds;
    while (now() < end) {
        burn_hot(3);
        burn_cold(1);
    }
}

static void *thread_main(void *arg) {
    burn_for(*(double *)arg);
    return NULL;
}

__attribute__((noinline)) static void burn_rounds(long rounds) {
    for (long r = 0; r < rounds; r++) {
        burn_hot(3);
        burn_cold(1);
    }
}

static void *rounds_main(void *arg) {
    burn_rounds(*(long *)arg);
    return NULL;
}

static void spawn_child(const char *self) {
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "--child", "0.4", (char *)NULL);
        _exit(127);
    }
    int status;
    // The parent keeps burning while the child runs, then reaps it.
    burn_for(0.5);
    waitpid(pid, &status, 0);
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--child") == 0) {
        double end = now() + (argc >= 3 ? atof(argv[2]) : 0.4);
        while (now() < end) child_only_work(4);
        struct timespec cpu;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
        printf("child_cpu_ns=%.0f\n", cpu.tv_sec * 1e9 + cpu.tv_nsec);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--spawn-child") == 0) {
        double seconds = argc >= 3 ? atof(argv[2]) : 2.0;
        burn_for(0.3);
        // The program's own path, so the child keeps the name "busy" (exec of /proc/self/exe
        // would name it "exe").
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) return 1;
        self[n] = 0;
        spawn_child(self);
        if (seconds > 0.8) burn_for(seconds - 0.8);
        return 0;
    }
    pthread_t ids[256];
    if (argc >= 3 && strcmp(argv[1], "--work") == 0) {
        long rounds = atol(argv[2]);
        int threads = argc >= 4 ? atoi(argv[3]) : 1;
        if (threads < 1) threads = 1;
        if (threads > 256) threads = 256;
        double start = now();
        for (int t = 1; t < threads; t++) pthread_create(&ids[t], NULL, rounds_main, &rounds);
        burn_rounds(rounds);
        for (int t = 1; t < threads; t++) pthread_join(ids[t], NULL);
        printf("elapsed_ns=%.0f\n", (now() - start) * 1e9);
        return 0;
    }
    double seconds = argc >= 2 ? atof(argv[1]) : 5.0;
    int threads = argc >= 3 ? atoi(argv[2]) : 1;
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    for (int t = 1; t < threads; t++) pthread_create(&ids[t], NULL, thread_main, &seconds);
    burn_for(seconds);
    for (int t = 1; t < threads; t++) pthread_join(ids[t], NULL);
    struct timespec cpu;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    printf("cpu_ns=%.0f\n", cpu.tv_sec * 1e9 + cpu.tv_nsec);
    return 0;
}
