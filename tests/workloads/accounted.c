// The bench's accountant: runs a command as its child and prints what the kernel accounted to
// it once it ended, its CPU time (user + system) and its peak RSS, with those of the children
// it waited for.
//
//   accounted CMD [ARGS...]     prints "cpu_s=X" and "peak_rss_kib=N"; the command's own
//                               output goes to /dev/null; exits 1 if it did not exit 0
//
// Why a process of its own: a child's peak RSS starts at its parent's. At exec, Linux records
// the peak of the memory the process had before (the parent's, shared or copied at fork) as
// the child's, so a tool run straight from the bench (tens of MB of its own) would be charged
// the bench's peak. This program's memory is a few hundred KB.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: accounted CMD [ARGS...]\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 2;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, STDOUT_FILENO);
            dup2(null, STDERR_FILENO);
        }
        execvp(argv[1], argv + 1);
        _exit(127);
    }
    int status = 0;
    struct rusage usage;
    if (wait4(pid, &status, 0, &usage) < 0) {
        perror("wait4");
        return 2;
    }
    double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                 usage.ru_stime.tv_usec / 1e6;
    printf("cpu_s=%.6f\npeak_rss_kib=%ld\n", cpu, usage.ru_maxrss);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
