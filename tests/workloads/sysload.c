// Syscall and scheduler workloads with known answers, for sysprof's tests and benchmarks.
//
//   sysload getppid N [spread]    N getppid calls; prints "ns_per_call=X" (the benchmark timer),
//                                 and the tracer's BPF time per call (parent_bpf.h).
//                                 With spread, an equal share of the calls on each CPU it may
//                                 use in turn: a tracer can cost more on one CPU than another
//                                 (bpftrace's tracepoint perf event lives on CPU 0 alone)
//   sysload badclose N            N close(-1) calls, each failing with EBADF
//   sysload badopens N            N rounds of five opens: three of a missing file (ENOENT), one
//                                 through a regular file (ENOTDIR), one of /dev/null (closed)
//   sysload sleep K MS            K sleeps of MS milliseconds, all in sleep_in_named_function
//   sysload twosites K MS         K rounds of two sleeps of MS ms, one from sleep_from_a and one
//                                 from sleep_from_b: the same sleep at the same depth, from two
//                                 callers (a blocking place told apart by its stack alone)
//   sysload tworeads K MS         K rounds of two reads in read_one, each waiting MS ms for a
//                                 byte: one from a pipe, then one from a terminal (a pty). The
//                                 same call at the same place in the same sleeping state, on
//                                 another descriptor: the same user stack, two kernel stacks
//   sysload nanosleeps N1 US1 N2 US2
//                                 N1 sleeps of US1 microseconds, then N2 of US2
//   sysload pingpong N [CPU|spread]
//                                 N round trips of one byte between two processes over pipes;
//                                 prints "ns_per_call=X" per round trip. With CPU, both run
//                                 on that CPU: each round trip is two context switches and no
//                                 cross-CPU wakeup, whose cost (tens of us in a VM) would
//                                 drown what a tracer adds. With spread, an equal share of the
//                                 round trips on each CPU it may use, both processes on it.
//                                 Then "cpu_ns=X", both processes' CPU time
//   sysload smallwrites N         N one-byte writes to /dev/null
//   sysload negatives N           N calls of maybe_fail, half of which return -1
//   sysload probecall N           N calls of probed_function; prints "ns_per_call=X" (the
//                                 uprobe benchmark's timer), and the tracer's BPF time per
//                                 call (parent_bpf.h)
//   sysload cetcall N             the same of cet_function (an endbr64, then a push)
//   sysload lockstorm THREADS SECONDS
//                                 THREADS threads fighting over one mutex in contended_worker
//   sysload lockedsleep THREADS SECONDS
//                                 THREADS threads that each hold one mutex across a 500 us
//                                 sleep in sleep_holding_lock (a lock held across I/O)
//   sysload stamps MS             prints "start_realtime_ns=X" first thing, sleeps MS ms, and
//                                 prints "end_realtime_ns=X" as it exits (the start and end
//                                 benchmark's clock: CLOCK_REALTIME, comparable across
//                                 processes)
//   sysload tickers THREADS SECONDS [QUIET_S]
//                                 THREADS threads that each wake every 10 ms for SECONDS,
//                                 after one sleep of QUIET_S (none when not given): a burst
//                                 from a process that was idle; prints "cpu_ns=X", the
//                                 process's CPU time
//   sysload leaderexit WAIT_MS MS  sleeps WAIT_MS, starts a thread that burns MS ms of its CPU
//                                 in burn_after_leader_exit, and ends its main thread alone
//                                 (pthread_exit): the process runs on without its leader
//   sysload forks N MS [BYTES]    N children, one after another, each exiting at once (after
//                                 mapping and unmapping BYTES, when given); then
//                                 one more that burns MS ms of CPU in burn_in_last_child and
//                                 whose pid is printed ("last_child=PID"), with the children's
//                                 page faults (getrusage): a command that starts more processes
//                                 than a tracer's target set holds
//
// Build: cc -O1 -g -fno-omit-frame-pointer -pthread -o sysload sysload.c
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "parent_bpf.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// The CPUs this process may run on, into cpus; how many.
static int usable_cpus(int *cpus) {
    cpu_set_t set;
    int count = 0;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (CPU_ISSET(cpu, &set)) cpus[count++] = cpu;
    }
    return count;
}

static int pin_to(int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof one, &one);
}

// N round trips of one byte with a child process over two pipes; the seconds they took, or -1.
static double pingpong(long n) {
    int there[2], back[2];
    if (pipe(there) || pipe(back)) return -1;
    char byte = 0;
    pid_t child = fork();
    if (child == 0) {
        for (long i = 0; i < n; i++) {
            if (read(there[0], &byte, 1) != 1 || write(back[1], &byte, 1) != 1) _exit(1);
        }
        _exit(0);
    }
    double start = now();
    for (long i = 0; i < n; i++) {
        if (write(there[1], &byte, 1) != 1 || read(back[0], &byte, 1) != 1) return -1;
    }
    double elapsed = now() - start;
    waitpid(child, NULL, 0);
    for (int i = 0; i < 2; i++) {
        close(there[i]);
        close(back[i]);
    }
    return elapsed;
}

// Calls nanosleep itself: the innermost function of the program's own on the sleeping stack.
__attribute__((noinline)) void sleep_in_named_function(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// One byte from fd: where both of tworeads' waits are.
__attribute__((noinline)) int read_one(int fd) {
    char byte;
    return read(fd, &byte, 1) == 1 ? 0 : -1;
}

// tworeads' other side, a process of its own (so that the reader stays single-threaded and
// libc's read touches no stack): a byte for the pipe, then one for the terminal, each after ms.
static void feed(int pipe_fd, int terminal_fd, long rounds, long ms) {
    char byte = 0;
    for (long i = 0; i < rounds; i++) {
        sleep_us(ms * 1000);
        if (write(pipe_fd, &byte, 1) != 1) break;
        sleep_us(ms * 1000);
        if (write(terminal_fd, &byte, 1) != 1) break;
    }
}

__attribute__((noinline)) void sleep_from_a(long ms) {
    sleep_in_named_function(ms);
    __asm__ volatile("");
}

__attribute__((noinline)) void sleep_from_b(long ms) {
    sleep_in_named_function(ms);
    __asm__ volatile("");
}

__attribute__((noinline)) int maybe_fail(int i) { return i % 2 ? -1 : i; }

/* Spins until this thread has used `ms` of CPU time. */
__attribute__((noinline)) void *burn_after_leader_exit(void *ms) {
    struct timespec ts;
    volatile uint64_t sink = 0;
    do {
        for (int i = 0; i < 100000; i++) sink += (uint64_t)i * i;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    } while (ts.tv_sec * 1000L + ts.tv_nsec / 1000000L < (long)(intptr_t)ms);
    return NULL;
}

/* Spins until this process has used `ms` of CPU time. */
__attribute__((noinline)) void burn_in_last_child(long ms) {
    struct timespec ts;
    volatile uint64_t sink = 0;
    do {
        for (int i = 0; i < 100000; i++) sink += (uint64_t)i * i;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    } while (ts.tv_sec * 1000L + ts.tv_nsec / 1000000L < ms);
}

__attribute__((noinline)) long probed_function(long i) {
    __asm__ volatile("" ::: "memory");
    return i + 1;
}

#if defined(__x86_64__)
// probed_function as a CET build compiles a function that saves a register: an endbr64 first,
// then a push (what sysprof probes instead, uprobes::entry_point). Written out, and kept from a
// CET compiler's own endbr64 before it (nocf_check).
#if defined(__CET__)
__attribute__((nocf_check))
#endif
__attribute__((naked, noinline)) long cet_function(long i) {
    __asm__("endbr64\n\tpush %rbx\n\tlea 1(%rdi), %rax\n\tpop %rbx\n\tret");
}
#else
__attribute__((noinline)) long cet_function(long i) { return probed_function(i); }
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile uint64_t shared_counter;
static double lock_deadline;

// The lock is taken and released straight from the workers' code: glibc has no frame pointers,
// and sysprof's unwinder (its .eh_frame tables) still finds the caller of pthread_mutex_lock.
// Macros, not functions: a wrapper (even inlined, through the debug info) would be the frame
// the contention is blamed on.
#define take_lock() pthread_mutex_lock(&lock)
#define release_lock() pthread_mutex_unlock(&lock)

__attribute__((noinline)) static void *contended_worker(void *arg) {
    (void)arg;
    while (now() < lock_deadline) {
        take_lock();
        // Hold the lock long enough that the others queue up behind it.
        for (int i = 0; i < 20000; i++) shared_counter += i;
        release_lock();
    }
    return NULL;
}

__attribute__((noinline)) static void *sleep_holding_lock(void *arg) {
    (void)arg;
    while (now() < lock_deadline) {
        take_lock();
        usleep(500);
        release_lock();
    }
    return NULL;
}

static double ticker_deadline, ticker_quiet_s;

__attribute__((noinline)) static void *ticker(void *arg) {
    (void)arg;
    if (ticker_quiet_s > 0) sleep_us((long)(ticker_quiet_s * 1e6));
    while (now() < ticker_deadline) sleep_us(10000);
    return NULL;
}

static double process_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: see the comment at the top of sysload.c\n");
        return 2;
    }
    const char *mode = argv[1];
    if (strcmp(mode, "stamps") == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        printf("start_realtime_ns=%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
        fflush(stdout);
        long ms = atol(argv[2]);
        struct timespec nap = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
        }
        clock_gettime(CLOCK_REALTIME, &ts);
        printf("end_realtime_ns=%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
        return 0;
    }
    if (strcmp(mode, "leaderexit") == 0 && argc >= 4) {
        long wait_ms = atol(argv[2]), ms = atol(argv[3]);
        struct timespec nap = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
        nanosleep(&nap, NULL);
        pthread_t worker;
        if (pthread_create(&worker, NULL, burn_after_leader_exit, (void *)(intptr_t)ms) != 0) return 1;
        pthread_exit(NULL);
    }
    if (strcmp(mode, "forks") == 0 && argc >= 4) {
        long n = atol(argv[2]), ms = atol(argv[3]);
        size_t bytes = argc >= 5 ? (size_t)atol(argv[4]) : 0;
        for (long i = 0; i < n; i++) {
            pid_t child = fork();
            if (child < 0) return 1;
            if (child == 0) {
                if (bytes) {
                    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                    if (map == MAP_FAILED || munmap(map, bytes) != 0) _exit(1);
                }
                _exit(0);
            }
            waitpid(child, NULL, 0);
        }
        pid_t last = fork();
        if (last < 0) return 1;
        if (last == 0) {
            burn_in_last_child(ms);
            _exit(0);
        }
        int status;
        waitpid(last, &status, 0);
        // Every child's faults, as the kernel counted them (a peer for a tracer's counts).
        struct rusage children;
        getrusage(RUSAGE_CHILDREN, &children);
        printf("last_child=%d self=%d children_minflt=%ld children_majflt=%ld\n", last, getpid(),
               children.ru_minflt, children.ru_majflt);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
    }
    if (strcmp(mode, "getppid") == 0) {
        long n = atol(argv[2]);
        int cpus[CPU_SETSIZE], count = argc >= 4 && strcmp(argv[3], "spread") == 0 ? usable_cpus(cpus) : 0;
        double elapsed = 0;
        for (int c = 0; c < (count ? count : 1); c++) {
            long share = count ? n / count : n;
            if (count && pin_to(cpus[c]) != 0) return 1;
            double start = now();
            for (long i = 0; i < share; i++) syscall(SYS_getppid);
            elapsed += now() - start;
        }
        printf("ns_per_call=%.2f\n", elapsed * 1e9 / (count ? n / count * count : n));
        print_parent_bpf(count ? n / count * count : n);
        return 0;
    }
    if (strcmp(mode, "badclose") == 0) {
        long n = atol(argv[2]);
        for (long i = 0; i < n; i++) close(-1);
        return 0;
    }
    if (strcmp(mode, "badopens") == 0) {
        long n = atol(argv[2]);
        for (long i = 0; i < n; i++) {
            for (int j = 0; j < 3; j++) open("/nonexistent-sysload", O_RDONLY);
            open("/dev/null/sysload", O_RDONLY);
            int fd = open("/dev/null", O_RDONLY);
            if (fd < 0) return 1;
            close(fd);
        }
        return 0;
    }
    if (strcmp(mode, "probecall") == 0) {
        long n = atol(argv[2]), x = 0;
        double start = now();
        for (long i = 0; i < n; i++) x = probed_function(x);
        printf("ns_per_call=%.2f\n", (now() - start) * 1e9 / n);
        print_parent_bpf(n);
        return x == n ? 0 : 1;
    }
    if (strcmp(mode, "cetcall") == 0) {
        long n = atol(argv[2]), x = 0;
        double start = now();
        for (long i = 0; i < n; i++) x = cet_function(x);
        printf("ns_per_call=%.2f\n", (now() - start) * 1e9 / n);
        return x == n ? 0 : 1;
    }
    if (strcmp(mode, "negatives") == 0) {
        long n = atol(argv[2]), failed = 0;
        for (long i = 0; i < n; i++) failed += maybe_fail((int)i) < 0;
        printf("failed=%ld\n", failed);
        return 0;
    }
    if (strcmp(mode, "smallwrites") == 0) {
        long n = atol(argv[2]);
        FILE *devnull = fopen("/dev/null", "w");
        if (!devnull) return 1;
        int fd = fileno(devnull);
        char byte = 'x';
        for (long i = 0; i < n; i++) {
            if (write(fd, &byte, 1) != 1) return 1;
        }
        return 0;
    }
    if (strcmp(mode, "sleep") == 0 && argc >= 4) {
        long k = atol(argv[2]), ms = atol(argv[3]);
        for (long i = 0; i < k; i++) sleep_in_named_function(ms);
        return 0;
    }
    if (strcmp(mode, "twosites") == 0 && argc >= 4) {
        long k = atol(argv[2]), ms = atol(argv[3]);
        for (long i = 0; i < k; i++) {
            sleep_from_a(ms);
            sleep_from_b(ms);
        }
        return 0;
    }
    if (strcmp(mode, "tworeads") == 0 && argc >= 4) {
        long rounds = atol(argv[2]), ms = atol(argv[3]);
        int pipe_fds[2];
        if (pipe(pipe_fds)) return 1;
        // A pseudo-terminal in raw mode: each byte written to the master is read at once.
        int master = posix_openpt(O_RDWR | O_NOCTTY);
        if (master < 0 || grantpt(master) || unlockpt(master)) return 1;
        int terminal = open(ptsname(master), O_RDWR | O_NOCTTY);
        struct termios raw;
        if (terminal < 0 || tcgetattr(terminal, &raw)) return 1;
        cfmakeraw(&raw);
        if (tcsetattr(terminal, TCSANOW, &raw)) return 1;
        pid_t feeder = fork();
        if (feeder == 0) {
            feed(pipe_fds[1], master, rounds, ms);
            _exit(0);
        }
        // One call site for both: the same return addresses on the stack.
        int fds[2] = {pipe_fds[0], terminal};
        for (long i = 0; i < 2 * rounds; i++) {
            if (read_one(fds[i % 2])) return 1;
        }
        waitpid(feeder, NULL, 0);
        return 0;
    }
    if (strcmp(mode, "nanosleeps") == 0 && argc >= 6) {
        long n1 = atol(argv[2]), us1 = atol(argv[3]), n2 = atol(argv[4]), us2 = atol(argv[5]);
        for (long i = 0; i < n1; i++) sleep_us(us1);
        for (long i = 0; i < n2; i++) sleep_us(us2);
        return 0;
    }
    if (strcmp(mode, "pingpong") == 0) {
        long n = atol(argv[2]);
        int cpus[CPU_SETSIZE], count = 0;
        if (argc >= 4 && strcmp(argv[3], "spread") == 0) {
            count = usable_cpus(cpus);
        } else if (argc >= 4) {
            cpus[0] = atoi(argv[3]);
            count = 1;
        }
        double elapsed = 0;
        for (int c = 0; c < (count ? count : 1); c++) {
            // Before the fork: the child inherits it.
            if (count && pin_to(cpus[c]) != 0) return 1;
            double took = pingpong(count ? n / count : n);
            if (took < 0) return 1;
            elapsed += took;
        }
        printf("ns_per_call=%.2f\n", elapsed * 1e9 / (count ? n / count * count : n));
        // Both ends' CPU time: this process's and its waited-for children's.
        struct rusage children;
        getrusage(RUSAGE_CHILDREN, &children);
        printf("cpu_ns=%.0f\n", process_cpu_ns() + (children.ru_utime.tv_sec + children.ru_stime.tv_sec) * 1e9 +
                                     (children.ru_utime.tv_usec + children.ru_stime.tv_usec) * 1e3);
        return 0;
    }
    if ((strcmp(mode, "lockstorm") == 0 || strcmp(mode, "lockedsleep") == 0) && argc >= 4) {
        int threads = atoi(argv[2]);
        lock_deadline = now() + atof(argv[3]);
        void *(*worker)(void *) = strcmp(mode, "lockstorm") == 0 ? contended_worker : sleep_holding_lock;
        pthread_t ids[64];
        if (threads > 64) threads = 64;
        for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, worker, NULL);
        for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
        return 0;
    }
    if (strcmp(mode, "tickers") == 0 && argc >= 4) {
        int threads = atoi(argv[2]);
        ticker_quiet_s = argc >= 5 ? atof(argv[4]) : 0;
        ticker_deadline = now() + ticker_quiet_s + atof(argv[3]);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        pthread_t *ids = calloc(threads, sizeof *ids);
        if (!ids) return 1;
        for (int t = 0; t < threads; t++) {
            if (pthread_create(&ids[t], &attr, ticker, NULL) != 0) return 1;
        }
        for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
        printf("cpu_ns=%.0f\n", process_cpu_ns());
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
