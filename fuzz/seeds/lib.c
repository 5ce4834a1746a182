/* A small shared library: exported functions that call libc through the PLT. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int seed_copy(char *to, const char *from, size_t len) {
    if (!to || !from) return -1;
    memcpy(to, from, len);
    return (int)strlen(to);
}

void *seed_alloc(size_t len) {
    void *p = calloc(1, len);
    if (!p) perror("calloc");
    return p;
}

int seed_print(const char *text) { return printf("%s\n", text); }
