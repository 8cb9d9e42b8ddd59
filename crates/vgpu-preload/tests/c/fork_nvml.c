/* fork_nvml: a fork while another thread is inside an NVML hook.
 *
 * usage: fork_nvml DELAY_MS
 * A second thread calls nvmlDeviceGetCount_v2 (under libvgpu.so with
 * LIBVGPU_FAILPOINT_NVML_STALL_MS it stays inside the hook, in the
 * library's own NVML query); after DELAY_MS the main thread forks. The
 * child's first NVML call must return: no lock of the library may be held
 * across an NVML call. The parent waits up to 20 s for the child, then
 * kills it and says so. Prints key=value facts.
 */
#define _GNU_SOURCE
#include <nvml.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

static nvmlReturn_t thread_rc = NVML_ERROR_UNKNOWN;
static unsigned int thread_count;

static void *counter(void *arg) {
    (void)arg;
    thread_rc = nvmlDeviceGetCount_v2(&thread_count);
    return NULL;
}

int main(int argc, char **argv) {
    long delay = argc > 1 ? atol(argv[1]) : 200;
    if (nvmlInit_v2() != NVML_SUCCESS) {
        puts("init=failed");
        return 1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, counter, NULL) != 0) {
        puts("thread=failed");
        return 1;
    }
    usleep((useconds_t)(delay * 1000));
    fflush(stdout);
    long t0 = now_ms();
    pid_t c = fork();
    if (c < 0) {
        puts("fork=failed");
        return 1;
    }
    if (c == 0) {
        unsigned int n = 0;
        nvmlReturn_t r = nvmlDeviceGetCount_v2(&n);
        printf("child_rc=%d\nchild_count=%u\nchild_ms=%ld\n", (int)r, n, now_ms() - t0);
        fflush(stdout);
        _exit(r == NVML_SUCCESS ? 0 : 2);
    }
    int status = 0, done = 0;
    while (now_ms() - t0 < 20000) {
        pid_t w = waitpid(c, &status, WNOHANG);
        if (w == c) {
            done = 1;
            break;
        }
        usleep(10 * 1000);
    }
    if (!done) {
        kill(c, SIGKILL);
        waitpid(c, &status, 0);
        puts("child_hung=1");
    } else {
        printf("child_exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    pthread_join(t, NULL);
    printf("thread_rc=%d\nthread_count=%u\n", (int)thread_rc, thread_count);
    nvmlShutdown();
    return 0;
}
