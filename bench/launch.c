/* Launcher for the throughput and host-cost measurements of bench/peers.py.
 *
 * Usage: launch SECONDS HUNG_SECONDS -- CMD [ARG...]
 *
 * Starts CMD again as soon as the previous run ended, until SECONDS have passed, and prints one line
 * per run: "run EXIT MAXRSS_KIB UTIME_US STIME_US START_NS END_NS" (CLOCK_MONOTONIC). It exists
 * because a child spawned from the Python harness inherits the interpreter's resident set until it
 * execs, and the kernel's peak-RSS figure (ru_maxrss) keeps that high-water mark: from this small
 * process the floor is its own ~1 MiB instead of Python's ~16 MiB. A run still going after
 * HUNG_SECONDS is killed and reported with EXIT -1.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static volatile pid_t current;

static void on_alarm(int sig) {
    (void)sig;
    if (current > 0)
        kill(current, SIGKILL);
}

int main(int argc, char **argv) {
    if (argc < 5 || argv[3][0] != '-' || argv[3][1] != '-') {
        fprintf(stderr, "usage: launch SECONDS HUNG_SECONDS -- CMD [ARG...]\n");
        return 2;
    }
    long long window = (long long)(atof(argv[1]) * 1e9);
    unsigned hung = (unsigned)atoi(argv[2]);
    char **cmd = argv + 4;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", 0 /* O_RDONLY */, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 1 /* O_WRONLY */, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", 1 /* O_WRONLY */, 0);
    signal(SIGALRM, on_alarm);
    long long start = now_ns(), deadline = start + window;
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    while (now_ns() < deadline) {
        long long t0 = now_ns();
        pid_t pid;
        if (posix_spawnp(&pid, cmd[0], &fa, NULL, cmd, environ) != 0) {
            perror("launch: posix_spawnp");
            return 1;
        }
        current = pid;
        alarm(hung);
        int status;
        struct rusage ru;
        while (wait4(pid, &status, 0, &ru) < 0)
            ;
        alarm(0);
        current = 0;
        long long t1 = now_ns();
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : (WTERMSIG(status) == SIGKILL ? -1 : 128 + WTERMSIG(status));
        printf("run %d %ld %lld %lld %lld %lld\n", code, ru.ru_maxrss,
               (long long)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec,
               (long long)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec, t0, t1);
    }
    return 0;
}
