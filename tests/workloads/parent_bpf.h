// The BPF run time of the process that launched this workload: sysprof, bpftrace or the
// benchmark's empty programs (`cargo xtask bench`), read from the parent's descriptors of its
// programs. The kernel counts it only while kernel.bpf_stats_enabled is 1 (it then reads the
// clock around every program run); the benchmark turns it on for runs of their own, and sets
// WORKLOAD_BPF_TIME=1 for them: elsewhere the workloads make no call for it (the tests count
// their calls exactly, getppid's among them).
#ifndef PARENT_BPF_H
#define PARENT_BPF_H

#include <dirent.h>
#include <stdlib.h>
#include <stdio.h>
#include <unistd.h>

// Prints "bpf_ns_per_call=X": the parent's programs' run time in ns per one of `operations`,
// each program counted once (by id) however many descriptors the parent holds of it. Prints
// nothing without WORKLOAD_BPF_TIME=1, or when the parent's descriptors cannot be read
// (another user's tracer) or hold no program.
static void print_parent_bpf(long operations) {
    const char *wanted = getenv("WORKLOAD_BPF_TIME");
    if (!wanted || wanted[0] != '1') return;
    char dir_path[64];
    snprintf(dir_path, sizeof dir_path, "/proc/%d/fdinfo", (int)getppid());
    DIR *dir = opendir(dir_path);
    if (!dir) return;
    unsigned long long total_ns = 0, seen[256];
    int programs = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] == '.') continue;
        char path[128], line[256];
        snprintf(path, sizeof path, "%s/%s", dir_path, entry->d_name);
        FILE *file = fopen(path, "r");
        if (!file) continue;
        unsigned long long id = 0, ns = 0;
        int has_time = 0;
        while (fgets(line, sizeof line, file)) {
            if (sscanf(line, "prog_id: %llu", &id) == 1) continue;
            if (sscanf(line, "run_time_ns: %llu", &ns) == 1) has_time = 1;
        }
        fclose(file);
        int known = 0;
        for (int i = 0; i < programs; i++) known |= seen[i] == id;
        if (!has_time || known || programs == (int)(sizeof seen / sizeof seen[0])) continue;
        seen[programs++] = id;
        total_ns += ns;
    }
    closedir(dir);
    if (programs > 0 && operations > 0) printf("bpf_ns_per_call=%.2f\n", (double)total_ns / operations);
}

#endif
