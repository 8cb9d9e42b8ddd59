/* fork_hold: cuInit, fork; the child makes one CUDA call of its own
 * (cuMemAlloc: the driver may refuse it in a forked child, as a real one
 * does; the interposer attaches the child either way); both hold HOLD_MS
 * and exit normally (exit(3): atexit handlers run).
 *
 * usage: fork_hold HOLD_MS
 * Prints `rc=<parent's cuInit>`, `child=<pid>`, `child_rc=`, `child_exit=`.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int hold = argc > 1 ? atoi(argv[1]) : 200;
    CUresult r = cuInit(0);
    printf("rc=%d\n", (int)r);
    fflush(stdout);
    pid_t c = fork();
    if (c < 0)
        return 1;
    if (c == 0) {
        CUdeviceptr d = 0;
        CUresult cr = cuMemAlloc(&d, 1 << 20);
        printf("child_rc=%d\n", (int)cr);
        fflush(stdout);
        usleep((useconds_t)hold * 1000);
        exit(0);
    }
    printf("child=%d\n", (int)c);
    fflush(stdout);
    usleep((useconds_t)hold * 1000);
    int st = 0;
    waitpid(c, &st, 0);
    printf("child_exit=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    return r == CUDA_SUCCESS && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
