/* A flat-out launcher for the SM limiter's tests (tests/limiter.rs),
 * compiled against NVIDIA's cuda.h and linked -lcuda.
 *
 *   launcher ROUTE PATHS WINDOW_MS KERNEL_US MODE
 *
 * ROUTE: how the launch entry points are obtained: direct (the linked
 * symbol), dlsym (dlsym on dlopen("libcuda.so.1")), proc11 (the v1
 * cuGetProcAddress at cudaVersion 11080), proc12 (cuGetProcAddress_v2 at
 * 12090). PATHS: comma-separated kernel, ex, coop, graph, each optionally
 * with _ptsz, multi (cuLaunchCooperativeKernelMultiDevice, one device)
 * and capture (50 cuLaunchKernel captured on a stream into a graph, the
 * capture's duration reported as "capture US", then the graph launched
 * flat out). MODE: async (flat out) or sync (launch then
 * cuStreamSynchronize). Each path runs for WINDOW_MS; per path one line
 * "window PATH START_NS END_NS LAUNCHES" (CLOCK_MONOTONIC). With
 * LAUNCHER_QUERY=1 a second thread calls cuMemGetInfo every 10 ms and the
 * end reports the slowest answer. Then "done", and the process holds
 * until stdin closes (so the test can read its slot).
 *
 * LAUNCHER_KERNEL picks where the kernel comes from: module (default:
 * cuModuleLoadData + cuModuleGetFunction), library (CUDA 12's
 * cuLibraryLoadData + cuLibraryGetKernel, the CUkernel passed where a
 * CUfunction goes, as CUDA 12 allows; no module is loaded) or
 * library_function (the same library, the CUfunction from
 * cuKernelGetFunction). The graph paths need module.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                            unsigned, unsigned, unsigned, CUstream, void **,
                                            void **);
extern CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
extern CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned,
                                                       unsigned, unsigned, unsigned, unsigned,
                                                       CUstream, void **);
extern CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec, CUstream);

typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **);
typedef CUresult (*graph_t)(CUgraphExec, CUstream);
typedef CUresult (*multi_t)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);
typedef CUresult (*proc_v1_t)(const char *, void **, int, cuuint64_t);

static const char *route;
static void *libcuda;

static void die(const char *what, int r) {
    fprintf(stderr, "launcher: %s failed (%d)\n", what, r);
    exit(2);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The entry point `base` (its _ptsz form when ptsz) by the route. */
static void *resolve(const char *base, int ptsz) {
    char name[128];
    snprintf(name, sizeof name, "%s%s", base, ptsz ? "_ptsz" : "");
    void *p = NULL;
    if (!strcmp(route, "direct")) {
        if (!strcmp(base, "cuLaunchKernel"))
            p = ptsz ? (void *)cuLaunchKernel_ptsz : (void *)cuLaunchKernel;
        else if (!strcmp(base, "cuLaunchKernelEx"))
            p = ptsz ? (void *)cuLaunchKernelEx_ptsz : (void *)cuLaunchKernelEx;
        else if (!strcmp(base, "cuLaunchCooperativeKernel"))
            p = ptsz ? (void *)cuLaunchCooperativeKernel_ptsz : (void *)cuLaunchCooperativeKernel;
        else if (!strcmp(base, "cuGraphLaunch"))
            p = ptsz ? (void *)cuGraphLaunch_ptsz : (void *)cuGraphLaunch;
        else if (!strcmp(base, "cuLaunchCooperativeKernelMultiDevice")) {
/* Deprecated since CUDA 11.3, still exported: the limiter paces it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
            p = (void *)cuLaunchCooperativeKernelMultiDevice;
#pragma GCC diagnostic pop
        }
    } else if (!strcmp(route, "dlsym")) {
        p = dlsym(libcuda, name);
    } else {
        cuuint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                : CU_GET_PROC_ADDRESS_DEFAULT;
        CUresult r;
        if (!strcmp(route, "proc11")) {
            proc_v1_t v1 = (proc_v1_t)dlsym(libcuda, "cuGetProcAddress");
            if (!v1)
                die("dlsym cuGetProcAddress", 0);
            r = v1(base, &p, 11080, flags);
        } else {
            CUdriverProcAddressQueryResult st;
            r = cuGetProcAddress_v2(base, &p, 12090, flags, &st);
        }
        if (r != CUDA_SUCCESS)
            die(name, r);
    }
    if (!p)
        die(name, -1);
    return p;
}

static volatile int stop_queries;
static uint64_t query_max_ns, queries;

static void *query_loop(void *ctx) {
    cuCtxSetCurrent((CUcontext)ctx);
    while (!stop_queries) {
        size_t f = 0, t = 0;
        uint64_t a = now_ns();
        CUresult r = cuMemGetInfo(&f, &t);
        uint64_t b = now_ns();
        if (r != CUDA_SUCCESS)
            die("cuMemGetInfo", r);
        if (b - a > query_max_ns)
            query_max_ns = b - a;
        queries++;
        usleep(10000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: launcher ROUTE PATHS WINDOW_MS KERNEL_US MODE\n");
        return 2;
    }
    route = argv[1];
    char *paths = strdup(argv[2]);
    uint64_t window = strtoull(argv[3], NULL, 10) * 1000000ull;
    uint64_t kernel_ns = strtoull(argv[4], NULL, 10) * 1000ull;
    int sync = !strcmp(argv[5], "sync");
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!libcuda)
        die("dlopen libcuda.so.1", 0);
    CUresult r = cuInit(0);
    if (r)
        die("cuInit", r);
    CUdevice dev;
    CUcontext ctx;
    if ((r = cuDeviceGet(&dev, 0)))
        die("cuDeviceGet", r);
    if ((r = cuCtxCreate(&ctx, 0, dev)))
        die("cuCtxCreate", r);
    const char *image = "vgpu-sim-module v1\nkernel spin\n";
    const char *source = getenv("LAUNCHER_KERNEL") ? getenv("LAUNCHER_KERNEL") : "module";
    CUfunction fn;
    if (!strcmp(source, "module")) {
        CUmodule mod;
        if ((r = cuModuleLoadData(&mod, image)))
            die("cuModuleLoadData", r);
        if ((r = cuModuleGetFunction(&fn, mod, "spin")))
            die("cuModuleGetFunction", r);
    } else {
        CUlibrary lib;
        CUkernel kern;
        if ((r = cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0)))
            die("cuLibraryLoadData", r);
        if ((r = cuLibraryGetKernel(&kern, lib, "spin")))
            die("cuLibraryGetKernel", r);
        if (!strcmp(source, "library"))
            fn = (CUfunction)kern;
        else if (!strcmp(source, "library_function")) {
            if ((r = cuKernelGetFunction(&fn, kern)))
                die("cuKernelGetFunction", r);
        } else
            die(source, -3);
    }
    /* One block: the kernel takes its parameter's time on the simulator. */
    uint64_t ns = kernel_ns;
    void *params[] = {&ns};
    /* A graph of 4 kernels of a quarter each. */
    uint64_t quarter = kernel_ns / 4;
    void *qparams[] = {&quarter};
    CUgraph g;
    if ((r = cuGraphCreate(&g, 0)))
        die("cuGraphCreate", r);
    CUgraphNode prev = NULL;
    for (int i = 0; i < 4; i++) {
        CUDA_KERNEL_NODE_PARAMS np;
        memset(&np, 0, sizeof np);
        np.func = fn;
        np.gridDimX = np.gridDimY = np.gridDimZ = 1;
        np.blockDimX = 128;
        np.blockDimY = np.blockDimZ = 1;
        np.kernelParams = qparams;
        CUgraphNode node;
        if ((r = cuGraphAddKernelNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &np)))
            die("cuGraphAddKernelNode", r);
        prev = node;
    }
    CUgraphExec exec;
    if ((r = cuGraphInstantiate(&exec, g, 0)))
        die("cuGraphInstantiate", r);

    pthread_t qt;
    int query = getenv("LAUNCHER_QUERY") && !strcmp(getenv("LAUNCHER_QUERY"), "1");
    if (query && pthread_create(&qt, NULL, query_loop, ctx))
        die("pthread_create", 0);

    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    for (char *save = NULL, *p = strtok_r(paths, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        int ptsz = strstr(p, "_ptsz") != NULL;
        char base[32];
        snprintf(base, sizeof base, "%.*s", (int)strcspn(p, "_"), p);
        launch_t launch = NULL;
        launch_ex_t launch_ex = NULL;
        coop_t coop = NULL;
        graph_t graph = NULL;
        multi_t multi = NULL;
        if (!strcmp(base, "kernel"))
            launch = (launch_t)resolve("cuLaunchKernel", ptsz);
        else if (!strcmp(base, "ex"))
            launch_ex = (launch_ex_t)resolve("cuLaunchKernelEx", ptsz);
        else if (!strcmp(base, "coop"))
            coop = (coop_t)resolve("cuLaunchCooperativeKernel", ptsz);
        else if (!strcmp(base, "graph"))
            graph = (graph_t)resolve("cuGraphLaunch", ptsz);
        else if (!strcmp(base, "multi"))
            multi = (multi_t)resolve("cuLaunchCooperativeKernelMultiDevice", 0);
        else if (!strcmp(base, "capture")) {
            /* Captured launches do not run: they must not be paced. */
            launch_t cap = (launch_t)resolve("cuLaunchKernel", 0);
            CUstream cs;
            if ((r = cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING)))
                die("cuStreamCreate", r);
            if ((r = cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL)))
                die("cuStreamBeginCapture", r);
            uint64_t t0 = now_ns();
            for (int i = 0; i < 50; i++)
                if ((r = cap(fn, 1, 1, 1, 128, 1, 1, 0, cs, params, NULL)))
                    die("captured cuLaunchKernel", r);
            uint64_t t1 = now_ns();
            CUgraph cg;
            if ((r = cuStreamEndCapture(cs, &cg)))
                die("cuStreamEndCapture", r);
            if ((r = cuGraphInstantiate(&exec, cg, 0)))
                die("cuGraphInstantiate (captured)", r);
            printf("capture %s %llu\n", p, (unsigned long long)((t1 - t0) / 1000));
            graph = (graph_t)resolve("cuGraphLaunch", 0);
        } else
            die(p, -2);
        CUDA_LAUNCH_PARAMS lp;
        memset(&lp, 0, sizeof lp);
        lp.function = fn;
        lp.gridDimX = lp.gridDimY = lp.gridDimZ = 1;
        lp.blockDimX = 128;
        lp.blockDimY = lp.blockDimZ = 1;
        lp.kernelParams = params;
        CUlaunchConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
        cfg.blockDimX = 128;
        cfg.blockDimY = cfg.blockDimZ = 1;
        uint64_t start = now_ns(), end = start + window, n = 0;
        while (now_ns() < end) {
            if (launch)
                r = launch(fn, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL);
            else if (launch_ex)
                r = launch_ex(&cfg, fn, params, NULL);
            else if (coop)
                r = coop(fn, 1, 1, 1, 128, 1, 1, 0, NULL, params);
            else if (multi)
                r = multi(&lp, 1, 0);
            else
                r = graph(exec, NULL);
            if (r)
                die(p, r);
            n++;
            if (sync && (r = ptsz ? cuStreamSynchronize(CU_STREAM_PER_THREAD)
                                  : cuStreamSynchronize(NULL)))
                die("cuStreamSynchronize", r);
        }
        printf("window %s %llu %llu %llu\n", p, (unsigned long long)start,
               (unsigned long long)now_ns(), (unsigned long long)n);
        fflush(stdout);
    }
    if ((r = cuCtxSynchronize()))
        die("cuCtxSynchronize", r);
    if (query) {
        stop_queries = 1;
        pthread_join(qt, NULL);
        printf("queries=%llu\nquery_max_us=%llu\n", (unsigned long long)queries,
               (unsigned long long)(query_max_ns / 1000));
    }
    printf("done\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
