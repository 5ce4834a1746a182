// Loads the CUDA runtime only after a while, as frameworks do (dlopen), then uses it: sysprof
// must pick the library up while tracing.
//
// Build: cc -O1 -g -fno-omit-frame-pointer -o gpu_dlopen gpu_dlopen.c -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

int main(void) {
    struct timespec wait = {0, 700 * 1000 * 1000};
    nanosleep(&wait, NULL);
    void *cudart = dlopen("libcudart.so.12", RTLD_NOW);
    if (!cudart) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    // sysprof probes a library within 0.2 s of its mapping: wait past that before calling.
    struct timespec settle = {0, 600 * 1000 * 1000};
    nanosleep(&settle, NULL);
    int (*cuda_malloc)(void **, size_t) = (int (*)(void **, size_t))dlsym(cudart, "cudaMalloc");
    void *ptr = NULL;
    for (int i = 0; i < 3; i++) printf("cudaMalloc=%d\n", cuda_malloc(&ptr, 4096));
    return 0;
}
