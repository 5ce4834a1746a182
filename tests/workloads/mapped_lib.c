// A program and its library, both a user's, for the tests of what sysprof reads of the files a
// target maps while their owner changes them (tests/hostile/target_files.rs).
//
// As a library (-shared -fPIC -DPREFIX=tf_public_, or tf_secret_ for the copy only root may
// read): the same code under names of the same length, so the two files have one layout and
// an offset in one is the same function's in the other; and 4,000 small functions after the
// hot one, so that its symbol and unwind tables take sysprof a while to read.
//
// As a program (-DPROGRAM, linked with the tf_public_ library):
//   mapped_lib SECONDS [LINK TARGET]   call the library's spin loop for SECONDS (printing "ready"
//                                      first); then, with LINK and TARGET, put a symbolic link to
//                                      TARGET in LINK's place and exit at once, as its maps were
//                                      last read
// As a program that maps no library of these (-DCUTTER):
//   cutter FILE SIZE SECONDS           for SECONDS, cut FILE to SIZE bytes and put the rest back,
//                                      over and over (printing "ready" first)
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

#if !defined(PROGRAM) && !defined(CUTTER)
#ifndef PREFIX
#define PREFIX tf_public_
#endif
#define NAME(x) CAT(PREFIX, x)

// The hot loop: a leaf that touches nothing of the library's but its own code, which lies in
// the file's first pages (so the program runs on while the rest of its file is cut away).
__attribute__((noinline)) unsigned long NAME(spin)(unsigned long n) {
    unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + i;
    return x;
}

// Hidden: in the symbol table, not the dynamic one, which comes before the code in the file.
#define F(n)                                                                                   \
    __attribute__((noinline, visibility("hidden"))) unsigned long NAME(CAT(filler_, n))(unsigned long x) { \
        return x * n + 7;                                                                      \
    }
#define F10(n) F(n##0) F(n##1) F(n##2) F(n##3) F(n##4) F(n##5) F(n##6) F(n##7) F(n##8) F(n##9)
#define F100(n) F10(n##0) F10(n##1) F10(n##2) F10(n##3) F10(n##4) F10(n##5) F10(n##6) F10(n##7) F10(n##8) F10(n##9)
#define F1000(n) F100(n##0) F100(n##1) F100(n##2) F100(n##3) F100(n##4) F100(n##5) F100(n##6) F100(n##7) F100(n##8) F100(n##9)
F1000(1) F1000(2) F1000(3) F1000(4)

#else
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

#ifdef PROGRAM
unsigned long tf_public_spin(unsigned long n);

__attribute__((noinline)) unsigned long run_loop(double seconds) {
    unsigned long sum = 0;
    double end = now() + seconds;
    while (now() < end) sum += tf_public_spin(200000);
    return sum;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: mapped_lib SECONDS [LINK TARGET]\n");
        return 2;
    }
    printf("ready\n");
    fflush(stdout);
    printf("sum=%lu\n", run_loop(atof(argv[1])));
    if (argc >= 4 && (unlink(argv[2]) != 0 || symlink(argv[3], argv[2]) != 0)) return 1;
    return 0;
}
#else
int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: cutter FILE SIZE SECONDS\n");
        return 2;
    }
    off_t size = atol(argv[2]);
    int fd = open(argv[1], O_RDWR);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || size >= st.st_size) return 1;
    size_t tail = st.st_size - size;
    char *rest = malloc(tail);
    if (!rest || pread(fd, rest, tail, size) != (ssize_t)tail) return 1;
    printf("ready\n");
    fflush(stdout);
    double end = now() + atof(argv[3]);
    while (now() < end) {
        if (ftruncate(fd, size) != 0) return 1;
        usleep(300);
        if (pwrite(fd, rest, tail, size) != (ssize_t)tail) return 1;
        usleep(300);
    }
    return 0;
}
#endif
#endif
