/* A small program that calls into libc through its PLT, with a few functions of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) long square_sum(long n) {
    long sum = 0;
    for (long i = 0; i < n; i++) sum += i * i;
    return sum;
}

__attribute__((noinline)) int check(const char *arg) {
    if (!arg) return -1;
    return atoi(arg) > 0;
}

int main(int argc, char **argv) {
    puts(argv[0]);
    char *buffer = malloc(argc * 16);
    memset(buffer, 0, argc);
    printf("%ld %d\n", square_sum(argc * 1000), check(argv[0]));
    free(buffer);
    return 0;
}
