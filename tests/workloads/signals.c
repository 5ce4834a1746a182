/* Signals of known counts: `signals N M` sends itself N SIGUSR1 with kill() and N SIGUSR2
 * with raise() (tgkill), each caught by a handler, then takes M SIGALRM from an interval timer
 * (sent by the kernel). It prints what its handlers counted: the answer sysprof must give. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t usr1, usr2, alrm;

static void on_signal(int sig) {
    if (sig == SIGUSR1) usr1++;
    else if (sig == SIGUSR2) usr2++;
    else if (sig == SIGALRM) alrm++;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: signals N M\n");
        return 2;
    }
    long n = atol(argv[1]), m = atol(argv[2]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    /* A signal a process sends itself is delivered before kill() returns: no two coalesce. */
    for (long i = 0; i < n; i++) kill(getpid(), SIGUSR1);
    for (long i = 0; i < n; i++) raise(SIGUSR2);
    struct itimerval timer = {.it_interval = {0, 2000}, .it_value = {0, 2000}};
    setitimer(ITIMER_REAL, &timer, NULL);
    sigset_t none;
    sigemptyset(&none);
    while (alrm < m) sigsuspend(&none);
    struct itimerval off = {0};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("usr1 %d usr2 %d alrm %d\n", (int)usr1, (int)usr2, (int)alrm);
    return 0;
}
