// Known call chains in code built WITHOUT frame pointers, for the unwinder's tests (built with
// -O2 -fomit-frame-pointer, as distributions build libc and python).
//
//   unwind spin SECONDS          main -> level1 -> level2 -> level3 -> leaf_spin, on the CPU
//   unwind work N                the same chain N times over; prints "elapsed_ns=X" (the
//                                unwinder benchmark's timer)
//   unwind sleep K MS            K sleeps of MS milliseconds in sleeper, through glibc's
//                                nanosleep
//   unwind lock SECONDS          two threads: holder keeps a mutex 20 ms at a time, waiter takes
//                                it through glibc's pthread_mutex_lock in lock_waiter
//   unwind dlopen LIB SECONDS    waits 300 ms, then dlopens LIB and calls its lib_outer (which
//                                calls lib_inner) for SECONDS, from run_library
//
// Build: cc -O2 -fomit-frame-pointer -g -pthread -o unwind unwind.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void leaf_spin(long n) {
    for (long i = 0; i < n; i++) sink += i * 7;
}
__attribute__((noinline)) void level3(long n) {
    leaf_spin(n);
    sink++;
}
__attribute__((noinline)) void level2(long n) {
    level3(n);
    sink++;
}
__attribute__((noinline)) void level1(long n) {
    level2(n);
    sink++;
}

__attribute__((noinline)) void sleeper(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    sink++;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static double deadline;

__attribute__((noinline)) void lock_holder_work(void) {
    double until = now() + 0.02;
    while (now() < until) sink++;
}

static void *holder(void *arg) {
    (void)arg;
    while (now() < deadline) {
        pthread_mutex_lock(&lock);
        lock_holder_work();
        pthread_mutex_unlock(&lock);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

__attribute__((noinline)) void lock_waiter(void) {
    while (now() < deadline) {
        pthread_mutex_lock(&lock);
        sink++;
        pthread_mutex_unlock(&lock);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

__attribute__((noinline)) void run_library(void (*outer)(double), double seconds) {
    outer(seconds);
    sink++;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "spin") == 0) {
        double end = now() + atof(argv[2]);
        while (now() < end) level1(2000000);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "work") == 0) {
        double start = now();
        for (long i = 0, n = atol(argv[2]); i < n; i++) level1(2000000);
        printf("elapsed_ns=%.0f\n", (now() - start) * 1e9);
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "sleep") == 0) {
        for (long i = 0, k = atol(argv[2]); i < k; i++) sleeper(atol(argv[3]));
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "lock") == 0) {
        deadline = now() + atof(argv[2]);
        pthread_t thread;
        pthread_create(&thread, NULL, holder, NULL);
        lock_waiter();
        pthread_join(thread, NULL);
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "dlopen") == 0) {
        struct timespec ts = {0, 300000000};
        nanosleep(&ts, NULL);
        void *lib = dlopen(argv[2], RTLD_NOW);
        if (!lib) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        void (*outer)(double) = (void (*)(double))dlsym(lib, "lib_outer");
        run_library(outer, atof(argv[3]));
        return 0;
    }
    fprintf(stderr, "usage: unwind spin S | work N | sleep K MS | lock S | dlopen LIB S\n");
    return 2;
}
