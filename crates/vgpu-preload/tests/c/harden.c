/* A scriptable CUDA client for the hardening tests: reads one command per
 * line on stdin and answers one line on stdout, so a Rust test can drive a
 * real process step by step (allocate, change the limits file, allocate
 * again) and read the ledger between steps. Built against NVIDIA's
 * cuda.h/nvml.h (with the v1 prototypes) and linked -lcuda -lnvidia-ml.
 *
 * Commands (SIZE in bytes; ROUTE is direct, dlsym or proc; every answer
 * starts with the command's name):
 *   init                   cuInit, primary context of ordinal 0 current
 *   ctx ORD                primary context of CUDA ordinal ORD current
 *   alloc SIZE             cuMemAlloc_v2 (pointer kept on a stack)
 *   free                   cuMemFree_v2 of the last pointer
 *   info                   cuMemGetInfo_v2 of the current device
 *   total ORD              cuDeviceTotalMem_v2
 *   v1alloc ROUTE SIZE     cuMemAlloc (v1, 32-bit) through ROUTE
 *   v1pitch ROUTE W H      cuMemAllocPitch (v1)
 *   v1free ROUTE           cuMemFree (v1) of the last v1 pointer
 *   v1array ROUTE W H      cuArrayCreate (v1), float, 1 channel
 *   v1array3d ROUTE W H D  cuArray3DCreate (v1), float, 1 channel
 *   v1ctx ROUTE            cuCtxCreate (v1) on ordinal 0, then pops it
 *   v1info ROUTE           cuMemGetInfo (v1)
 *   v1total ROUTE          cuDeviceTotalMem (v1) of ordinal 0
 *   arrfree                cuArrayDestroy of the last array
 *   ctxfree                cuCtxDestroy_v2 of the last v1 context
 *   ctxalloc SIZE          cuMemAlloc_v2 inside the last v1 context
 *   vmm SIZE               cuMemCreate + cuMemAddressReserve + cuMemMap
 *   vmmrelease             cuMemRelease of the last VMM handle (mapping stays)
 *   vmmunmap               cuMemUnmap + cuMemAddressFree of the last mapping
 *   reset ORD              cuDevicePrimaryCtxReset_v2 (frees everything on it)
 *   race N                 N threads make their first CUDA call at once
 *   nvmlprocs              NVML process list and utilization of index 0
 *   burn MS                launch 2 ms kernels on the current context for MS ms
 *   graph N SIZE [free]    a new graph of N alloc nodes of SIZE on ordinal 0
 *                          (cuGraphAddMemAllocNode), then a free node for each
 *                          with `free`
 *   gcapture SIZE [free] [new]
 *                          a new graph captured on a new stream with
 *                          cuStreamBeginCaptureToGraph (cuStreamBeginCapture_v2
 *                          with `new`): cuMemAllocAsync of SIZE (then
 *                          cuMemFreeAsync with `free`); answers `captured=`,
 *                          the pointer's address when the capture returned one
 *   ginst FLAGS            cuGraphInstantiateWithFlags of the last graph
 *   gupload                cuGraphUpload of the last executable
 *   glaunch                cuGraphLaunch of the last executable, then
 *                          cuCtxSynchronize
 *   gfree                  cuMemFree_v2 of the last graph's allocations
 *   gfreeasync             cuMemFreeAsync (then cuStreamSynchronize) of them
 *   gexecdestroy           cuGraphExecDestroy of the last executable
 *   gtrim                  cuDeviceGraphMemTrim of ordinal 0
 *   gmem                   cuDeviceGetGraphMemAttribute: used and reserved
 *   quit
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <dlfcn.h>
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The v1 ABI under names of our own, bound to the exact exported symbols
 * (cuda.h maps the plain names to the _v2 ones). */
extern CUresult d_cuMemAlloc(CUdeviceptr_v1 *, unsigned int) __asm__("cuMemAlloc");
extern CUresult d_cuMemAllocPitch(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int,
                                  unsigned int) __asm__("cuMemAllocPitch");
extern CUresult d_cuMemFree(CUdeviceptr_v1) __asm__("cuMemFree");
extern CUresult d_cuArrayCreate(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *) __asm__("cuArrayCreate");
extern CUresult d_cuArray3DCreate(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *) __asm__("cuArray3DCreate");
extern CUresult d_cuCtxCreate(CUcontext *, unsigned int, CUdevice) __asm__("cuCtxCreate");
extern CUresult d_cuMemGetInfo(unsigned int *, unsigned int *) __asm__("cuMemGetInfo");
extern CUresult d_cuDeviceTotalMem(unsigned int *, CUdevice) __asm__("cuDeviceTotalMem");

typedef CUresult (*alloc1_t)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*pitch1_t)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int);
typedef CUresult (*free1_t)(CUdeviceptr_v1);
typedef CUresult (*arr1_t)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *);
typedef CUresult (*arr3_t)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *);
typedef CUresult (*ctx1_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*info1_t)(unsigned int *, unsigned int *);
typedef CUresult (*total1_t)(unsigned int *, CUdevice);

static void *g_cuda;
static CUresult (*g_proc)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* The v1 function NAME by ROUTE: the direct binding, dlsym of the plain
 * name (what Python ctypes does), or cuGetProcAddress at version 2000. */
static void *route(const char *how, const char *name, void *direct) {
    if (!strcmp(how, "direct"))
        return direct;
    if (!strcmp(how, "dlsym"))
        return dlsym(g_cuda, name);
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (g_proc(name, &p, 2000, 0, &st) != CUDA_SUCCESS)
        return NULL;
    return p;
}

static CUdeviceptr g_ptrs[4096];
static int g_nptr;
static CUdeviceptr_v1 g_v1[4096];
static int g_nv1;
static CUarray g_arrs[256];
static int g_narr;
static CUcontext g_ctxs[64];
static int g_nctx;
static CUmemGenericAllocationHandle g_vh[256];
static CUdeviceptr g_va[256];
static size_t g_vs[256];
static int g_nvh, g_nva;

/* The last graph (and its allocations' addresses) and executable. */
static CUgraph g_graph;
static CUgraphExec g_exec;
static CUdeviceptr g_gptrs[64];
static int g_ngptr;

/* A graph of `n` alloc nodes of `size` bytes on ordinal 0, then a free node
 * for each when `with_free`. */
static CUresult make_graph(unsigned n, size_t size, int with_free) {
    CUresult r = cuGraphCreate(&g_graph, 0);
    g_ngptr = 0;
    CUgraphNode last = NULL;
    for (unsigned i = 0; r == CUDA_SUCCESS && i < n && i < 64; i++) {
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = 0;
        p.bytesize = size;
        CUgraphNode node = NULL;
        r = cuGraphAddMemAllocNode(&node, g_graph, last ? &last : NULL, last ? 1 : 0, &p);
        if (r == CUDA_SUCCESS) {
            g_gptrs[g_ngptr++] = p.dptr;
            last = node;
        }
    }
    for (int i = 0; r == CUDA_SUCCESS && with_free && i < g_ngptr; i++) {
        CUgraphNode node = NULL;
        r = cuGraphAddMemFreeNode(&node, g_graph, &last, 1, g_gptrs[i]);
        if (r == CUDA_SUCCESS)
            last = node;
    }
    return r;
}

/* A graph captured from stream-ordered calls on a new stream: into a new
 * graph with cuStreamBeginCaptureToGraph (or cuStreamBeginCapture_v2). */
static CUresult capture_graph(size_t size, int with_free, int classic, CUresult *alloc_rc) {
    CUstream s = NULL;
    CUresult r = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    g_graph = NULL;
    g_ngptr = 0;
    if (r == CUDA_SUCCESS && !classic)
        r = cuGraphCreate(&g_graph, 0);
    if (r == CUDA_SUCCESS)
        r = classic ? cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL)
                    : cuStreamBeginCaptureToGraph(s, g_graph, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr d = 0;
    *alloc_rc = cuMemAllocAsync(&d, size, s);
    if (*alloc_rc == CUDA_SUCCESS) {
        g_gptrs[g_ngptr++] = d;
        if (with_free)
            *alloc_rc = cuMemFreeAsync(d, s);
    }
    CUgraph got = NULL;
    r = cuStreamEndCapture(s, &got);
    if (r == CUDA_SUCCESS && !classic && got != g_graph)
        r = CUDA_ERROR_INVALID_VALUE;
    g_graph = got;
    cuStreamDestroy_v2(s);
    return r;
}

static pthread_barrier_t g_bar;
static void *racer(void *arg) {
    (void)arg;
    pthread_barrier_wait(&g_bar);
    int n = 0;
    CUdevice d;
    cuInit(0);
    cuDeviceGetCount(&n);
    cuDeviceGet(&d, 0);
    /* The first call that needs the region (cuInit attaches only under
     * LIBVGPU_ATTACH=eager): a view, no context needed. */
    size_t f, t;
    cuDeviceTotalMem_v2(&t, d);
    cuMemGetInfo_v2(&f, &t);
    return NULL;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_cuda = dlopen("libcuda.so.1", RTLD_NOW);
    *(void **)&g_proc = dlsym(g_cuda, "cuGetProcAddress_v2");
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        char cmd[32] = {0}, how[32] = {0};
        unsigned long long a = 0, b = 0, c = 0;
        int n = sscanf(line, "%31s", cmd);
        if (n < 1)
            continue;
        const char *rest = line + strlen(cmd);
        if (!strcmp(cmd, "quit")) {
            printf("quit\n");
            break;
        } else if (!strcmp(cmd, "init")) {
            CUresult r = cuInit(0);
            CUdevice d;
            CUcontext ctx = NULL;
            if (r == CUDA_SUCCESS)
                r = cuDeviceGet(&d, 0);
            if (r == CUDA_SUCCESS)
                r = cuDevicePrimaryCtxRetain(&ctx, d);
            if (r == CUDA_SUCCESS)
                r = cuCtxSetCurrent(ctx);
            printf("init rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "ctx")) {
            sscanf(rest, "%llu", &a);
            CUdevice d;
            CUcontext ctx = NULL;
            CUresult r = cuDeviceGet(&d, (int)a);
            if (r == CUDA_SUCCESS)
                r = cuDevicePrimaryCtxRetain(&ctx, d);
            if (r == CUDA_SUCCESS)
                r = cuCtxSetCurrent(ctx);
            printf("ctx rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "alloc")) {
            sscanf(rest, "%llu", &a);
            CUdeviceptr p = 0;
            CUresult r = cuMemAlloc_v2(&p, (size_t)a);
            if (r == CUDA_SUCCESS && g_nptr < 4096)
                g_ptrs[g_nptr++] = p;
            printf("alloc rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "free")) {
            CUresult r = g_nptr ? cuMemFree_v2(g_ptrs[--g_nptr]) : CUDA_ERROR_INVALID_VALUE;
            printf("free rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "info")) {
            size_t f = 0, t = 0;
            CUresult r = cuMemGetInfo_v2(&f, &t);
            printf("info rc=%d free=%zu total=%zu\n", (int)r, f, t);
        } else if (!strcmp(cmd, "total")) {
            sscanf(rest, "%llu", &a);
            CUdevice d;
            size_t t = 0;
            CUresult r = cuDeviceGet(&d, (int)a);
            if (r == CUDA_SUCCESS)
                r = cuDeviceTotalMem_v2(&t, d);
            printf("total rc=%d total=%zu\n", (int)r, t);
        } else if (!strcmp(cmd, "v1alloc")) {
            sscanf(rest, "%31s %llu", how, &a);
            alloc1_t f = (alloc1_t)route(how, "cuMemAlloc", (void *)d_cuMemAlloc);
            CUdeviceptr_v1 p = 0;
            CUresult r = f ? f(&p, (unsigned int)a) : CUDA_ERROR_NOT_FOUND;
            if (r == CUDA_SUCCESS && g_nv1 < 4096)
                g_v1[g_nv1++] = p;
            printf("v1alloc rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "v1pitch")) {
            sscanf(rest, "%31s %llu %llu", how, &a, &b);
            pitch1_t f = (pitch1_t)route(how, "cuMemAllocPitch", (void *)d_cuMemAllocPitch);
            CUdeviceptr_v1 p = 0;
            unsigned int pitch = 0;
            CUresult r = f ? f(&p, &pitch, (unsigned)a, (unsigned)b, 4) : CUDA_ERROR_NOT_FOUND;
            if (r == CUDA_SUCCESS && g_nv1 < 4096)
                g_v1[g_nv1++] = p;
            printf("v1pitch rc=%d pitch=%u\n", (int)r, pitch);
        } else if (!strcmp(cmd, "v1free")) {
            sscanf(rest, "%31s", how);
            free1_t f = (free1_t)route(how, "cuMemFree", (void *)d_cuMemFree);
            CUresult r = (f && g_nv1) ? f(g_v1[--g_nv1]) : CUDA_ERROR_INVALID_VALUE;
            printf("v1free rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "v1array")) {
            sscanf(rest, "%31s %llu %llu", how, &a, &b);
            arr1_t f = (arr1_t)route(how, "cuArrayCreate", (void *)d_cuArrayCreate);
            CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)a, (unsigned)b, CU_AD_FORMAT_FLOAT, 1};
            CUarray h = NULL;
            CUresult r = f ? f(&h, &d) : CUDA_ERROR_NOT_FOUND;
            if (r == CUDA_SUCCESS && g_narr < 256)
                g_arrs[g_narr++] = h;
            printf("v1array rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "v1array3d")) {
            sscanf(rest, "%31s %llu %llu %llu", how, &a, &b, &c);
            arr3_t f = (arr3_t)route(how, "cuArray3DCreate", (void *)d_cuArray3DCreate);
            CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)a, (unsigned)b, (unsigned)c, CU_AD_FORMAT_FLOAT, 1, 0};
            CUarray h = NULL;
            CUresult r = f ? f(&h, &d) : CUDA_ERROR_NOT_FOUND;
            if (r == CUDA_SUCCESS && g_narr < 256)
                g_arrs[g_narr++] = h;
            printf("v1array3d rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "arrfree")) {
            CUresult r = g_narr ? cuArrayDestroy(g_arrs[--g_narr]) : CUDA_ERROR_INVALID_VALUE;
            printf("arrfree rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "v1ctx")) {
            sscanf(rest, "%31s", how);
            ctx1_t f = (ctx1_t)route(how, "cuCtxCreate", (void *)d_cuCtxCreate);
            CUcontext ctx = NULL, prev = NULL;
            cuCtxGetCurrent(&prev);
            CUresult r = f ? f(&ctx, 0, 0) : CUDA_ERROR_NOT_FOUND;
            if (r == CUDA_SUCCESS) {
                if (g_nctx < 64)
                    g_ctxs[g_nctx++] = ctx;
                cuCtxSetCurrent(prev);
            }
            printf("v1ctx rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "ctxalloc")) {
            sscanf(rest, "%llu", &a);
            CUcontext prev = NULL;
            CUdeviceptr p = 0;
            CUresult r = CUDA_ERROR_INVALID_CONTEXT;
            cuCtxGetCurrent(&prev);
            if (g_nctx && cuCtxSetCurrent(g_ctxs[g_nctx - 1]) == CUDA_SUCCESS) {
                r = cuMemAlloc_v2(&p, (size_t)a);
                cuCtxSetCurrent(prev);
            }
            printf("ctxalloc rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "ctxfree")) {
            CUresult r = g_nctx ? cuCtxDestroy_v2(g_ctxs[--g_nctx]) : CUDA_ERROR_INVALID_VALUE;
            printf("ctxfree rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "v1info")) {
            sscanf(rest, "%31s", how);
            info1_t f = (info1_t)route(how, "cuMemGetInfo", (void *)d_cuMemGetInfo);
            unsigned int fr = 0, t = 0;
            CUresult r = f ? f(&fr, &t) : CUDA_ERROR_NOT_FOUND;
            printf("v1info rc=%d free=%u total=%u\n", (int)r, fr, t);
        } else if (!strcmp(cmd, "v1total")) {
            sscanf(rest, "%31s", how);
            total1_t f = (total1_t)route(how, "cuDeviceTotalMem", (void *)d_cuDeviceTotalMem);
            unsigned int t = 0;
            CUresult r = f ? f(&t, 0) : CUDA_ERROR_NOT_FOUND;
            printf("v1total rc=%d total=%u\n", (int)r, t);
        } else if (!strcmp(cmd, "vmm")) {
            sscanf(rest, "%llu", &a);
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = 0;
            CUmemGenericAllocationHandle h = 0;
            CUdeviceptr va = 0;
            CUresult r = cuMemCreate(&h, (size_t)a, &prop, 0);
            if (r == CUDA_SUCCESS)
                r = cuMemAddressReserve(&va, (size_t)a, 0, 0, 0);
            if (r == CUDA_SUCCESS)
                r = cuMemMap(va, (size_t)a, 0, h, 0);
            if (r == CUDA_SUCCESS && g_nvh < 256) {
                g_vh[g_nvh++] = h;
                g_va[g_nva] = va;
                g_vs[g_nva++] = (size_t)a;
            }
            printf("vmm rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "vmmrelease")) {
            CUresult r = g_nvh ? cuMemRelease(g_vh[--g_nvh]) : CUDA_ERROR_INVALID_VALUE;
            printf("vmmrelease rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "vmmunmap")) {
            CUresult r = CUDA_ERROR_INVALID_VALUE;
            if (g_nva) {
                g_nva--;
                r = cuMemUnmap(g_va[g_nva], g_vs[g_nva]);
                if (r == CUDA_SUCCESS)
                    r = cuMemAddressFree(g_va[g_nva], g_vs[g_nva]);
            }
            printf("vmmunmap rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "reset")) {
            sscanf(rest, "%llu", &a);
            CUdevice d;
            CUresult r = cuDeviceGet(&d, (int)a);
            if (r == CUDA_SUCCESS)
                r = cuDevicePrimaryCtxReset_v2(d);
            g_nptr = 0;
            printf("reset rc=%d\n", (int)r);
        } else if (!strcmp(cmd, "race")) {
            sscanf(rest, "%llu", &a);
            pthread_t t[256];
            unsigned k = a > 256 ? 256 : (unsigned)a;
            pthread_barrier_init(&g_bar, NULL, k);
            for (unsigned i = 0; i < k; i++)
                pthread_create(&t[i], NULL, racer, NULL);
            for (unsigned i = 0; i < k; i++)
                pthread_join(t[i], NULL);
            pthread_barrier_destroy(&g_bar);
            printf("race done\n");
        } else if (!strcmp(cmd, "burn")) {
            sscanf(rest, "%llu", &a);
            CUmodule mod = NULL;
            CUfunction fn = NULL;
            const char *image = "vgpu-sim-module v1\nkernel busy block_us=2000\n";
            CUresult r = cuModuleLoadData(&mod, image);
            if (r == CUDA_SUCCESS)
                r = cuModuleGetFunction(&fn, mod, "busy");
            struct timespec t0, t;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            unsigned long long n = 0;
            for (;;) {
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (r != CUDA_SUCCESS ||
                    (unsigned long long)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000) >= a)
                    break;
                r = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
                if (r == CUDA_SUCCESS && ++n % 4 == 0)
                    r = cuCtxSynchronize();
            }
            cuCtxSynchronize();
            printf("burn rc=%d launches=%llu\n", (int)r, n);
        } else if (!strcmp(cmd, "graph")) {
            char opt[32] = {0};
            sscanf(rest, "%llu %llu %31s", &a, &b, opt);
            printf("graph rc=%d\n", (int)make_graph((unsigned)a, (size_t)b, !strcmp(opt, "free")));
        } else if (!strcmp(cmd, "gcapture")) {
            char o1[32] = {0}, o2[32] = {0};
            sscanf(rest, "%llu %31s %31s", &a, o1, o2);
            int with_free = !strcmp(o1, "free") || !strcmp(o2, "free");
            int classic = !strcmp(o1, "new") || !strcmp(o2, "new");
            CUresult ar = CUDA_ERROR_NOT_PERMITTED;
            CUresult r = capture_graph((size_t)a, with_free, classic, &ar);
            printf("gcapture rc=%d alloc_rc=%d captured=%d\n", (int)r, (int)ar, g_ngptr);
        } else if (!strcmp(cmd, "ginst")) {
            sscanf(rest, "%llu", &a);
            g_exec = NULL;
            printf("ginst rc=%d\n", (int)cuGraphInstantiateWithFlags(&g_exec, g_graph, a));
        } else if (!strcmp(cmd, "gupload")) {
            printf("gupload rc=%d\n", (int)cuGraphUpload(g_exec, NULL));
        } else if (!strcmp(cmd, "glaunch")) {
            CUresult r = cuGraphLaunch(g_exec, NULL);
            CUresult s2 = cuCtxSynchronize();
            printf("glaunch rc=%d sync=%d\n", (int)r, (int)s2);
        } else if (!strcmp(cmd, "gfree") || !strcmp(cmd, "gfreeasync")) {
            CUresult r = CUDA_SUCCESS;
            for (int i = 0; i < g_ngptr; i++) {
                CUresult x = !strcmp(cmd, "gfree") ? cuMemFree_v2(g_gptrs[i]) : cuMemFreeAsync(g_gptrs[i], NULL);
                if (x != CUDA_SUCCESS)
                    r = x;
            }
            if (!strcmp(cmd, "gfreeasync"))
                cuStreamSynchronize(NULL);
            printf("%s rc=%d\n", cmd, (int)r);
        } else if (!strcmp(cmd, "gexecdestroy")) {
            printf("gexecdestroy rc=%d\n", (int)cuGraphExecDestroy(g_exec));
        } else if (!strcmp(cmd, "gtrim")) {
            printf("gtrim rc=%d\n", (int)cuDeviceGraphMemTrim(0));
        } else if (!strcmp(cmd, "gmem")) {
            cuuint64_t u = 0, v = 0;
            CUresult r = cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &u);
            if (r == CUDA_SUCCESS)
                r = cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v);
            printf("gmem rc=%d used=%llu reserved=%llu\n", (int)r, (unsigned long long)u, (unsigned long long)v);
        } else if (!strcmp(cmd, "nvmlprocs")) {
            nvmlDevice_t h;
            nvmlReturn_t r = nvmlInit_v2();
            if (r == NVML_SUCCESS)
                r = nvmlDeviceGetHandleByIndex_v2(0, &h);
            if (r != NVML_SUCCESS) {
                printf("nvmlprocs rc=%d\n", (int)r);
                continue;
            }
            nvmlProcessInfo_t p[64];
            unsigned cnt = 64;
            r = nvmlDeviceGetComputeRunningProcesses_v3(h, &cnt, p);
            unsigned long long sum = 0;
            printf("nvmlprocs rc=%d count=%u", (int)r, r == NVML_SUCCESS ? cnt : 0);
            for (unsigned i = 0; r == NVML_SUCCESS && i < cnt; i++) {
                printf(" pid%u=%u mem%u=%llu", i, p[i].pid, i, p[i].usedGpuMemory);
                sum += p[i].usedGpuMemory;
            }
            nvmlMemory_t m;
            nvmlDeviceGetMemoryInfo(h, &m);
            nvmlUtilization_t u = {0, 0};
            nvmlReturn_t ru = nvmlDeviceGetUtilizationRates(h, &u);
            printf(" sum=%llu used=%llu total=%llu util_rc=%d gpu=%u\n", sum, m.used, m.total, (int)ru, u.gpu);
        } else {
            printf("%s unknown\n", cmd);
        }
    }
    return 0;
}
