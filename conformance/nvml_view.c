/* nvml_view: what NVML sees, from a process that is not a worker.
 *
 *   nvml_view [demo]        two workers, one inside
 *                           `unshare --pid --fork --mount-proc`; NVML
 *                           (this process, a third observer) must list both
 *                           under their host PIDs with their memory; after
 *                           SIGKILL of the namespaced one its entry and its
 *                           memory must be gone. Checked, and printed.
 *   nvml_view util [MS]     kernel model: one busy process, then two; NVML
 *                           must show ~100 % device utilization, and ~50 %
 *                           per process when two share the device.
 *   nvml_view list          print every device and its processes.
 *   nvml_view worker MIB    (internal) hold a context and MIB MiB until
 *                           stdin closes.
 *   nvml_view busy MS       (internal) launch back-to-back kernels for MS ms.
 *
 * Runs unchanged on the real driver or on vgpu-sim (VGPU_SIM_DIR + the
 * LD_LIBRARY_PATH that `vgpu sim env` prints).
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#define CHECK_CUDA 1
#define CHECK_NVML 1
#include "check.h"
#include "sim_kernel.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

WEAK(cuInit);
WEAK(cuDeviceGetAttribute);
WEAK(cuCtxSynchronize);
WEAK(cuMemAlloc_v2);
WEAK(cuModuleLoadData);
WEAK(cuModuleGetFunction);
WEAK(cuLaunchKernel);
WEAK(cuEventCreate);
WEAK(cuEventRecord);
WEAK(cuEventSynchronize);
WEAK(nvmlInit_v2);
WEAK(nvmlShutdown);
WEAK(nvmlDeviceGetCount_v2);
WEAK(nvmlDeviceGetHandleByIndex_v2);
WEAK(nvmlDeviceGetName);
WEAK(nvmlDeviceGetMemoryInfo);
WEAK(nvmlDeviceGetComputeRunningProcesses_v3);
WEAK(nvmlDeviceGetUtilizationRates);
WEAK(nvmlDeviceGetProcessUtilization);

#define MiB (1024ull * 1024ull)

static void die(const char *what) {
    fprintf(stderr, "nvml_view: %s: %s\n", what, strerror(errno));
    exit(2);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_ms(unsigned ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

/* ---- workers -------------------------------------------------------- */

/* Hold a context and `mib` MiB on device 0 until stdin closes. */
static int worker(unsigned long long mib) {
    CUcontext ctx;
    CUdeviceptr p;
    CUresult r;
    if ((r = CU(cuInit, 0)) || (r = CU(conf_cuCtxCreate_v2, &ctx, 0, 0)) ||
        (r = CU(cuMemAlloc_v2, &p, mib * MiB))) {
        printf("ERROR %s\n", cu_name(r));
        return 1;
    }
    /* How many processes this worker's own /proc shows: 1-2 inside a fresh
     * PID namespace, many outside. */
    int procs = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d)))
        procs += e->d_name[0] >= '1' && e->d_name[0] <= '9';
    if (d)
        closedir(d);
    printf("READY %d %d\n", (int)getpid(), procs);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}

/* Give device 0 `ms` ms of work: one-wave 10 ms kernels launched back to
 * back, at most IN_FLIGHT queued (the device never waits on the host even
 * if this process is descheduled for 100 ms, as on a loaded 2-core machine:
 * with 4 queued, 40 ms, a run read 87 % for a busy process; a second
 * process's launches still interleave as with a real driver's time
 * slicing). */
#define IN_FLIGHT 12

static CUresult create_events(CUevent *ev) {
    for (int i = 0; i < IN_FLIGHT; i++) {
        CUresult r = CU(cuEventCreate, &ev[i], CU_EVENT_DEFAULT);
        if (r)
            return r;
    }
    return CUDA_SUCCESS;
}

static int busy(unsigned ms) {
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUevent ev[IN_FLIGHT];
    CUresult r;
    int sms = 1;
    if ((r = CU(cuInit, 0)) || (r = CU(conf_cuCtxCreate_v2, &ctx, 0, 0)) ||
        (r = create_events(ev)) ||
        (r = CU(cuModuleLoadData, &mod, sim_module_image())) ||
        (r = CU(cuModuleGetFunction, &fn, mod, sim_kernel_name())) ||
        (r = CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0))) {
        printf("ERROR %s\n", cu_name(r));
        return 1;
    }
    uint64_t block_ns = 10000000; /* one wave of SM-count blocks = 10 ms */
    void *args[] = {&block_ns};
    printf("READY %d\n", (int)getpid());
    fflush(stdout);
    unsigned count = ms / 10;
    for (unsigned i = 0; i < count; i++) {
        if ((i >= IN_FLIGHT && (r = CU(cuEventSynchronize, ev[i % IN_FLIGHT]))) ||
            (r = CU(cuLaunchKernel, fn, sms, 1, 1, 128, 1, 1, 0, NULL, args, NULL)) ||
            (r = CU(cuEventRecord, ev[i % IN_FLIGHT], NULL))) {
            printf("ERROR %s\n", cu_name(r));
            return 1;
        }
    }
    return CU(cuCtxSynchronize) == CUDA_SUCCESS ? 0 : 1;
}

/* ---- spawning -------------------------------------------------------- */

struct child {
    pid_t pid;      /* the process we forked (unshare, for a namespaced one) */
    pid_t hostpid;  /* the worker itself, as the host PID namespace sees it */
    int inner_pid;  /* what the worker's getpid() says */
    int procs;      /* processes its own /proc shows */
    int to, from;   /* its stdin (write end) and stdout (read end) */
    FILE *out;
    char unshare_log[64]; /* unshare's own stderr (shown if it fails) */
};

static char self_exe[4096];

/* The first process whose parent is `parent` (host /proc). */
static pid_t child_of(pid_t parent) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (d && !found && (e = readdir(d))) {
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "PPid:", 5)) {
                if (atoi(line + 5) == parent)
                    found = atoi(e->d_name);
                break;
            }
        fclose(f);
    }
    if (d)
        closedir(d);
    return found;
}

static void show_unshare_log(struct child *c) {
    if (!c->unshare_log[0])
        return;
    FILE *f = fopen(c->unshare_log, "r");
    char buf[512];
    size_t n;
    while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stderr);
    if (f)
        fclose(f);
}

static int spawn(struct child *c, int in_ns, const char *mode, const char *arg) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
        die("pipe");
    /* unshare's own complaints (e.g. util-linux's "sigprocmask unblock
     * failed" after its child is SIGKILLed) go to a file, shown only if
     * the worker never comes up; the worker keeps our stderr. */
    char ulog[64] = "";
    int ulog_fd = -1;
    if (in_ns) {
        snprintf(ulog, sizeof ulog, "/tmp/nvml_view-unshare.XXXXXX");
        ulog_fd = mkstemp(ulog);
        if (ulog_fd < 0)
            die("mkstemp");
    }
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        if (in_ns) {
            dup2(2, 3);
            dup2(ulog_fd, 2);
            execlp("unshare", "unshare", "--pid", "--fork", "--mount-proc", "/bin/sh", "-c",
                   "exec 2>&3 3>&-; exec \"$0\" \"$@\"", self_exe, mode, arg, (char *)NULL);
        }
        else
            execl(self_exe, self_exe, mode, arg, (char *)NULL);
        fprintf(stderr, "nvml_view: exec: %s\n", strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (ulog_fd >= 0)
        close(ulog_fd);
    memset(c, 0, sizeof *c);
    snprintf(c->unshare_log, sizeof c->unshare_log, "%s", ulog);
    c->pid = pid;
    c->hostpid = pid;
    c->to = in[1];
    c->from = out[0];
    c->out = fdopen(out[0], "r");
    char line[256] = "";
    if (!c->out || !fgets(line, sizeof line, c->out) ||
        sscanf(line, "READY %d %d", &c->inner_pid, &c->procs) < 1) {
        line[strcspn(line, "\n")] = 0;
        fprintf(stderr, "nvml_view: %s worker did not start (it said: \"%s\")\n", mode, line);
        show_unshare_log(c);
        return 0;
    }
    if (in_ns) {
        /* unshare --fork: the worker is unshare's only child. */
        char path[128];
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", pid, pid);
        FILE *f = fopen(path, "r");
        int hp = 0;
        if (!f || fscanf(f, "%d", &hp) != 1)
            hp = 0;
        if (f)
            fclose(f);
        if (hp == 0) /* kernels without CONFIG_PROC_CHILDREN: search PPid */
            hp = child_of(pid);
        c->hostpid = hp;
    }
    return 1;
}

static int reap(struct child *c) {
    int st = 0;
    if (c->to >= 0)
        close(c->to);
    c->to = -1;
    while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (c->out)
        fclose(c->out);
    c->out = NULL;
    if (c->unshare_log[0])
        unlink(c->unshare_log);
    c->unshare_log[0] = 0;
    return st;
}

/* ---- observing ------------------------------------------------------- */

struct proc {
    unsigned pid;
    unsigned long long mem;
};

/* Device 0's compute processes; returns the count or -1. */
static int processes(struct proc *out, int max) {
    nvmlDevice_t h;
    nvmlProcessInfo_t info[64];
    unsigned n = 64;
    if (NV(nvmlDeviceGetHandleByIndex_v2, 0, &h) ||
        NV(nvmlDeviceGetComputeRunningProcesses_v3, h, &n, info))
        return -1;
    for (unsigned i = 0; i < n && (int)i < max; i++) {
        out[i].pid = info[i].pid;
        out[i].mem = info[i].usedGpuMemory;
    }
    return (int)n;
}

static const struct proc *find(const struct proc *p, int n, unsigned pid) {
    for (int i = 0; i < n; i++)
        if (p[i].pid == pid)
            return &p[i];
    return NULL;
}

static void print_devices(void) {
    unsigned n = 0;
    if (NV(nvmlDeviceGetCount_v2, &n)) {
        printf("  (nvmlDeviceGetCount_v2 failed)\n");
        return;
    }
    for (unsigned d = 0; d < n; d++) {
        nvmlDevice_t h;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "?";
        nvmlMemory_t m = {0, 0, 0};
        nvmlUtilization_t u = {0, 0};
        nvmlProcessInfo_t info[64];
        unsigned np = 64;
        if (NV(nvmlDeviceGetHandleByIndex_v2, d, &h))
            continue;
        NV(nvmlDeviceGetName, h, name, sizeof name);
        NV(nvmlDeviceGetMemoryInfo, h, &m);
        NV(nvmlDeviceGetUtilizationRates, h, &u);
        printf("  GPU %u  %-28s  memory %6llu / %6llu MiB used  SM util %3u %%\n", d, name,
               m.used / MiB, m.total / MiB, u.gpu);
        if (NV(nvmlDeviceGetComputeRunningProcesses_v3, h, &np, info)) {
            printf("    (process list unavailable)\n");
            continue;
        }
        if (np == 0)
            printf("    no compute processes\n");
        for (unsigned i = 0; i < np; i++)
            printf("    pid %-8u %6llu MiB\n", info[i].pid, info[i].usedGpuMemory / MiB);
    }
}

static int list(void) {
    if (NV(nvmlInit_v2)) {
        fprintf(stderr, "nvml_view: nvmlInit_v2 failed\n");
        return 1;
    }
    printf("NVML sees:\n");
    print_devices();
    NV(nvmlShutdown);
    return 0;
}

/* Poll until `pid` is gone from device 0's list (a driver releases a dead
 * process's resources asynchronously). */
static int wait_gone(unsigned pid, struct proc *p, int *n) {
    double deadline = now_s() + 20;
    do {
        *n = processes(p, 64);
        if (*n >= 0 && !find(p, *n, pid))
            return 1;
        sleep_ms(50);
    } while (now_s() < deadline);
    return 0;
}

static int demo(void) {
    g_prog = "nvml_view demo";
    const unsigned long long mib_a = 512, mib_b = 1024;
    if (!OK_NV(nvmlInit_v2))
        return finish();
    printf("\nThis process (pid %d) observes through NVML and holds no context.\n",
           (int)getpid());
    struct proc p[64];
    /* Others may use a real GPU: count from what is there before. */
    int n0 = processes(p, 64);
    if (!CHECK(n0 >= 0, "NVML process list readable (%d before the workers start)", n0))
        return finish();
    int n;
    unsigned long long used0 = 0;
    nvmlDevice_t h;
    nvmlMemory_t m;
    if (!NV(nvmlDeviceGetHandleByIndex_v2, 0, &h) && !NV(nvmlDeviceGetMemoryInfo, h, &m))
        used0 = m.used;

    struct child a, b;
    char arg_a[32], arg_b[32];
    snprintf(arg_a, sizeof arg_a, "%llu", mib_a);
    snprintf(arg_b, sizeof arg_b, "%llu", mib_b);
    if (!CHECK(spawn(&a, 0, "worker", arg_a), "worker A started (%llu MiB)", mib_a))
        return finish();
    printf("worker A: pid %d, allocated %llu MiB\n", (int)a.hostpid, mib_a);
    if (!CHECK(spawn(&b, 1, "worker", arg_b), "worker B started in its own PID namespace"))
        return finish();
    printf("worker B: inside `unshare --pid --fork --mount-proc`: getpid() = %d, its /proc "
           "shows %d process(es); host pid %d; allocated %llu MiB\n",
           b.inner_pid, b.procs, (int)b.hostpid, mib_b);
    CHECK(b.inner_pid != b.hostpid && b.hostpid > 0,
          "worker B's own pid (%d) differs from its host pid (%d)", b.inner_pid, (int)b.hostpid);

    printf("\nNVML sees:\n");
    print_devices();
    n = processes(p, 64);
    const struct proc *pa = find(p, n, (unsigned)a.hostpid);
    const struct proc *pb = find(p, n, (unsigned)b.hostpid);
    CHECK(n == n0 + 2, "NVML lists the two workers (%d entries, %d before)", n, n0);
    CHECK(pa && pa->mem >= mib_a * MiB, "worker A listed under host pid %d with >= %llu MiB",
          (int)a.hostpid, mib_a);
    CHECK(pb && pb->mem >= mib_b * MiB, "worker B listed under host pid %d with >= %llu MiB",
          (int)b.hostpid, mib_b);
    CHECK(!find(p, n, (unsigned)b.inner_pid) || b.inner_pid == a.hostpid,
          "worker B's namespace pid %d is not what NVML reports", b.inner_pid);

    printf("\nSIGKILL worker B (host pid %d)\n", (int)b.hostpid);
    CHECK(kill(b.hostpid, SIGKILL) == 0, "SIGKILL delivered");
    reap(&b);
    CHECK(wait_gone((unsigned)b.hostpid, p, &n), "worker B's entry is gone from NVML");
    CHECK(n == n0 + 1 && find(p, n, (unsigned)a.hostpid), "worker A is still listed");
    /* A driver frees a dead process's memory at its teardown, which need
     * not be the same instant its list entry goes: wait for it, boundedly. */
    unsigned long long used1 = ~0ull;
    double deadline = now_s() + 5;
    do {
        if (!NV(nvmlDeviceGetMemoryInfo, h, &m))
            used1 = m.used;
        if (pa && used1 <= used0 + pa->mem)
            break;
        sleep_ms(10);
    } while (now_s() < deadline);
    CHECK(pa && used1 <= used0 + pa->mem,
          "worker B's memory is released within 5 s: device used %llu MiB (A holds %llu MiB)",
          used1 / MiB, pa ? pa->mem / MiB : 0);
    printf("\nNVML sees:\n");
    print_devices();

    int st = reap(&a);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker A exits cleanly when told");
    CHECK(wait_gone((unsigned)a.hostpid, p, &n) && n == n0, "both workers gone from NVML");
    NV(nvmlShutdown);
    return finish();
}

static int util(unsigned ms) {
    g_prog = "nvml_view util";
    if (!OK_NV(nvmlInit_v2))
        return finish();
    nvmlDevice_t h;
    if (!OK_NV(nvmlDeviceGetHandleByIndex_v2, 0, &h))
        return finish();
    char arg[32];
    snprintf(arg, sizeof arg, "%u", ms);
    for (int k = 1; k <= 2; k++) {
        struct child c[2];
        int ok = 1;
        for (int i = 0; i < k; i++)
            ok &= CHECK(spawn(&c[i], 0, "busy", arg), "busy worker %d of %d started", i + 1, k);
        if (!ok)
            return finish();
        /* Sample mid-run: NVML's window (1 s on the sim) then holds only
         * the workers' kernels. */
        sleep_ms(ms * 6 / 10);
        nvmlUtilization_t u = {0, 0};
        OK_NV(nvmlDeviceGetUtilizationRates, h, &u);
        nvmlProcessUtilizationSample_t s[64];
        unsigned n = 64;
        memset(s, 0, sizeof s);
        OK_NV(nvmlDeviceGetProcessUtilization, h, s, &n, 0);
        printf("%d busy process(es): device SM utilization %u %%", k, u.gpu);
        unsigned per[2] = {0, 0};
        for (int i = 0; i < k; i++) {
            for (unsigned j = 0; j < n; j++)
                if (s[j].pid == (unsigned)c[i].pid && s[j].smUtil > per[i])
                    per[i] = s[j].smUtil;
            printf(", pid %d %u %%", (int)c[i].pid, per[i]);
        }
        printf("\n");
        CHECK(u.gpu >= 90, "%d busy: device utilization %u %% is ~100 %%", k, u.gpu);
        for (int i = 0; i < k; i++) {
            unsigned lo = k == 1 ? 90 : 35, hi = k == 1 ? 100 : 65;
            CHECK(per[i] >= lo && per[i] <= hi, "%d busy: process %d at %u %% (want %u-%u %%)", k,
                  i + 1, per[i], lo, hi);
        }
        for (int i = 0; i < k; i++) {
            int st = reap(&c[i]);
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "busy worker %d exits cleanly", i + 1);
        }
    }
    NV(nvmlShutdown);
    return finish();
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    ssize_t l = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (l <= 0)
        die("readlink /proc/self/exe");
    self_exe[l] = 0;
    const char *mode = argc > 1 ? argv[1] : "demo";
    if (!strcmp(mode, "worker") && argc == 3)
        return worker(strtoull(argv[2], NULL, 10));
    if (!strcmp(mode, "busy") && argc == 3)
        return busy((unsigned)strtoul(argv[2], NULL, 10));
    if (!strcmp(mode, "list"))
        return list();
    if (!strcmp(mode, "util"))
        return util(argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 2000);
    if (!strcmp(mode, "demo"))
        return demo();
    fprintf(stderr, "usage: nvml_view [demo | util [MS] | list | worker MIB | busy MS]\n");
    return 2;
}
