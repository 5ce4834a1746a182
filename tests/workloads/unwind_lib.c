// The library `unwind dlopen` loads mid-run: lib_outer -> lib_inner, built without frame
// pointers. Build: cc -O2 -fomit-frame-pointer -g -shared -fPIC -o libunwind_lib.so unwind_lib.c
#include <time.h>

static volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void lib_inner(long n) {
    for (long i = 0; i < n; i++) sink += i * 3;
}

__attribute__((noinline)) void lib_outer(double seconds) {
    double end = now() + seconds;
    while (now() < end) lib_inner(1000000);
    sink++;
}
