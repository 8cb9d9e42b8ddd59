/* cuda_query: what bindings and JIT-compiling clients call besides
 * allocating and launching, through NVIDIA's cuda.h: stream and context
 * queries, limits, cache config, peers, function attributes, occupancy,
 * loading PTX with cuModuleLoadDataEx, linking, CUDA 12's library
 * management (cuLibrary*, cuKernel*), graph memory nodes, and
 * handles a binding can keep as signed 64-bit integers. Runs unchanged
 * on a real GPU (the JIT'd kernel is conformance/sim_kernel.h's PTX).
 * Prints PASS/FAIL lines.
 */
#define _GNU_SOURCE
#define CHECK_CUDA 1
#include "check.h"
#include "sim_kernel.h"

#define MiB (1024ull * 1024ull)

WEAK(cuInit);
WEAK(cuDeviceGet);
WEAK(cuDeviceGetCount);
WEAK(cuDeviceGetPCIBusId);
WEAK(cuDeviceGetByPCIBusId);
WEAK(cuDeviceCanAccessPeer);
WEAK(cuDeviceGetP2PAttribute);
WEAK(cuDevicePrimaryCtxRetain);
WEAK(cuDevicePrimaryCtxRelease_v2);
WEAK(cuCtxCreate_v4);
WEAK(cuCtxDestroy_v2);
WEAK(cuCtxSetCurrent);
WEAK(cuCtxGetCurrent);
WEAK(cuCtxSynchronize);
WEAK(cuCtxGetStreamPriorityRange);
WEAK(cuCtxGetLimit);
WEAK(cuCtxSetLimit);
WEAK(cuCtxGetCacheConfig);
WEAK(cuCtxSetCacheConfig);
WEAK(cuCtxEnablePeerAccess);
WEAK(cuCtxDisablePeerAccess);
WEAK(cuStreamCreate);
WEAK(cuStreamCreateWithPriority);
WEAK(cuStreamGetPriority);
WEAK(cuStreamGetFlags);
WEAK(cuStreamGetCtx);
WEAK(cuStreamSynchronize);
WEAK(cuStreamDestroy_v2);
WEAK(cuEventCreate);
WEAK(cuEventRecord);
WEAK(cuEventSynchronize);
WEAK(cuEventElapsedTime);
WEAK(cuEventDestroy_v2);
WEAK(cuMemAlloc_v2);
WEAK(cuMemFree_v2);
WEAK(cuMemGetInfo_v2);
WEAK(cuModuleLoadDataEx);
WEAK(cuModuleGetFunction);
WEAK(cuModuleUnload);
WEAK(cuModuleLoadData);
WEAK(cuFuncGetAttribute);
WEAK(cuFuncSetAttribute);
WEAK(cuOccupancyMaxActiveBlocksPerMultiprocessor);
WEAK(cuLaunchKernel);
WEAK(cuLinkCreate_v2);
WEAK(cuLinkAddData_v2);
WEAK(cuLinkComplete);
WEAK(cuLinkDestroy);
WEAK(cuGraphCreate);
WEAK(cuGraphAddMemAllocNode);
WEAK(cuGraphAddMemFreeNode);
WEAK(cuGraphMemAllocNodeGetParams);
WEAK(cuGraphInstantiateWithFlags);
WEAK(cuGraphLaunch);
WEAK(cuGraphExecDestroy);
WEAK(cuGraphDestroy);
WEAK(cuDeviceGetGraphMemAttribute);
WEAK(cuDeviceGraphMemTrim);
WEAK(cuGraphGetNodes);
WEAK(cuGraphNodeGetType);
WEAK(cuStreamBeginCaptureToGraph);
WEAK(cuStreamEndCapture);
WEAK(cuMemAllocAsync);
WEAK(cuMemFreeAsync);
WEAK(cuMemcpyHtoD_v2);
WEAK(cuMemcpyDtoH_v2);
WEAK(cuFuncGetName);
WEAK(cuLibraryLoadData);
WEAK(cuLibraryUnload);
WEAK(cuLibraryGetKernel);
WEAK(cuLibraryGetKernelCount);
WEAK(cuLibraryEnumerateKernels);
WEAK(cuLibraryGetModule);
WEAK(cuLibraryGetGlobal);
WEAK(cuKernelGetFunction);
WEAK(cuKernelGetLibrary);
WEAK(cuKernelGetAttribute);
WEAK(cuKernelGetName);

static size_t free_mem(void) {
    size_t f = 0, t = 0;
    return CU(cuMemGetInfo_v2, &f, &t) == CUDA_SUCCESS ? f : 0;
}

/* Handles a binding keeps as a signed 64-bit integer: positive, aligned
 * like the pointers a real driver hands out. */
static void check_handle(const char *what, const void *h) {
    int64_t s = (int64_t)(intptr_t)h;
    CHECK(s > 0 && s % 8 == 0, "%s handle %#llx is a positive, aligned signed 64-bit value", what,
          (unsigned long long)(uintptr_t)h);
}

static void test_streams(CUcontext ctx) {
    int least = 99, greatest = 99;
    if (OK_CU(cuCtxGetStreamPriorityRange, &least, &greatest))
        CHECK(least == 0 && greatest < 0, "stream priorities from %d (least) to %d (greatest)", least, greatest);
    OK_CU(cuCtxGetStreamPriorityRange, NULL, &greatest);
    CUstream s = NULL, d = NULL;
    if (OK_CU(cuStreamCreateWithPriority, &s, CU_STREAM_NON_BLOCKING, greatest)) {
        check_handle("stream", s);
        int prio = 99;
        unsigned flags = 99;
        CUcontext c = NULL;
        if (OK_CU(cuStreamGetPriority, s, &prio))
            CHECK(prio == greatest, "cuStreamGetPriority = %d", prio);
        if (OK_CU(cuStreamGetFlags, s, &flags))
            CHECK(flags == CU_STREAM_NON_BLOCKING, "cuStreamGetFlags = %u", flags);
        if (OK_CU(cuStreamGetCtx, s, &c))
            CHECK(c == ctx, "cuStreamGetCtx is the creating context");
        OK_CU(cuStreamDestroy_v2, s);
    }
    if (OK_CU(cuStreamCreate, &d, CU_STREAM_DEFAULT)) {
        int prio = 99;
        if (OK_CU(cuStreamGetPriority, d, &prio))
            CHECK(prio == 0, "a default stream's priority is 0 (%d)", prio);
        OK_CU(cuStreamDestroy_v2, d);
    }
    int prio = 99;
    if (OK_CU(cuStreamGetPriority, NULL, &prio))
        CHECK(prio == 0, "the NULL stream's priority is 0");
}

static void test_limits(void) {
    size_t v = 0;
    if (OK_CU(cuCtxGetLimit, &v, CU_LIMIT_STACK_SIZE))
        CHECK(v > 0, "CU_LIMIT_STACK_SIZE = %zu", v);
    if (OK_CU(cuCtxSetLimit, CU_LIMIT_MALLOC_HEAP_SIZE, 64 * MiB) && OK_CU(cuCtxGetLimit, &v, CU_LIMIT_MALLOC_HEAP_SIZE))
        CHECK(v >= 64 * MiB, "CU_LIMIT_MALLOC_HEAP_SIZE set to 64 MiB reads %zu", v);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuCtxGetLimit, NULL, CU_LIMIT_STACK_SIZE);
    CUfunc_cache c = (CUfunc_cache)99;
    if (OK_CU(cuCtxGetCacheConfig, &c))
        CHECK(c <= CU_FUNC_CACHE_PREFER_EQUAL, "cuCtxGetCacheConfig = %d", (int)c);
    OK_CU(cuCtxSetCacheConfig, CU_FUNC_CACHE_PREFER_SHARED);
}

static void test_devices(int n) {
    int can = -1;
    if (OK_CU(cuDeviceCanAccessPeer, &can, 0, 0))
        CHECK(can == 0, "a device is not its own peer (%d)", can);
    char bus[32] = "";
    CUdevice d = -1;
    if (OK_CU(cuDeviceGetPCIBusId, bus, sizeof bus, 0) && OK_CU(cuDeviceGetByPCIBusId, &d, bus))
        CHECK(d == 0, "cuDeviceGetByPCIBusId(%s) = %d", bus, d);
    if (n < 2) {
        printf("# one device: peer checks skipped\n");
        return;
    }
    if (OK_CU(cuDeviceCanAccessPeer, &can, 0, 1))
        CHECK(can == 1, "device 0 reaches device 1 (%d)", can);
    int v = -1;
    if (OK_CU(cuDeviceGetP2PAttribute, &v, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, 0, 1))
        CHECK(v == 1, "P2P access supported between 0 and 1 (%d)", v);
    CUcontext c0, c1;
    if (OK_CU(cuDevicePrimaryCtxRetain, &c0, 0) && OK_CU(cuDevicePrimaryCtxRetain, &c1, 1)) {
        OK_CU(cuCtxSetCurrent, c0);
        OK_CU(cuCtxEnablePeerAccess, c1, 0);
        CHECK_CU(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cuCtxEnablePeerAccess, c1, 0);
        OK_CU(cuCtxDisablePeerAccess, c1);
        CHECK_CU(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, cuCtxDisablePeerAccess, c1);
        OK_CU(cuDevicePrimaryCtxRelease_v2, 1);
    }
}

/* A PTX image JIT'd by cuModuleLoadDataEx (with JIT options, as clients
 * pass them), its function's attributes and occupancy, and a launch. */
static void test_jit(void) {
    CUjit_option opts[2] = {CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_OPTIMIZATION_LEVEL};
    void *vals[2] = {(void *)(uintptr_t)0, (void *)(uintptr_t)3};
    CUmodule mod = NULL;
    if (!OK_CU(cuModuleLoadDataEx, &mod, SPIN_PTX, 2, opts, vals))
        return;
    check_handle("module", mod);
    CUfunction fn = NULL;
    if (!OK_CU(cuModuleGetFunction, &fn, mod, "spin"))
        return;
    check_handle("function", fn);
    CUfunction none;
    CHECK_CU(CUDA_ERROR_NOT_FOUND, cuModuleGetFunction, &none, mod, "no_such_kernel");
    int v = -1;
    if (OK_CU(cuFuncGetAttribute, &v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn))
        CHECK(v >= 32 && v <= 1024, "MAX_THREADS_PER_BLOCK = %d", v);
    if (OK_CU(cuFuncGetAttribute, &v, CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        CHECK(v >= 0, "NUM_REGS = %d", v);
    OK_CU(cuFuncSetAttribute, fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024);
    if (OK_CU(cuFuncGetAttribute, &v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn))
        CHECK(v == 1024, "MAX_DYNAMIC_SHARED_SIZE_BYTES set to 1024 reads %d", v);
    int blocks = -1;
    if (OK_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, &blocks, fn, 256, 0))
        CHECK(blocks >= 1 && blocks <= 32, "occupancy of 256-thread blocks = %d per SM", blocks);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuOccupancyMaxActiveBlocksPerMultiprocessor, &blocks, fn, 0, 0);
    CUevent a, b;
    CU(cuEventCreate, &a, CU_EVENT_DEFAULT);
    CU(cuEventCreate, &b, CU_EVENT_DEFAULT);
    uint64_t ns = 1000000;
    void *args[] = {&ns};
    OK_CU(cuEventRecord, a, 0);
    OK_CU(cuLaunchKernel, fn, 4, 1, 1, 128, 1, 1, 0, 0, args, NULL);
    OK_CU(cuEventRecord, b, 0);
    OK_CU(cuEventSynchronize, b);
    float ms = -1;
    if (OK_CU(cuEventElapsedTime, &ms, a, b))
        CHECK(ms >= 0.0f, "a JIT'd kernel ran (%.3f ms)", ms);
    cuEventDestroy_v2(a);
    cuEventDestroy_v2(b);
    OK_CU(cuModuleUnload, mod);
}

/* CUDA 12's library management, as current Python JIT stacks use it: a
 * library of the PTX, its kernel launched both as the CUkernel itself
 * (where a CUfunction goes) and through the context's CUfunction. */
static void test_library(CUdevice dev) {
    CUlibrary lib = NULL;
    if (!OK_CU(cuLibraryLoadData, &lib, SPIN_PTX, NULL, NULL, 0, NULL, NULL, 0))
        return;
    check_handle("library", lib);
    CUkernel k = NULL, none = NULL;
    if (!OK_CU(cuLibraryGetKernel, &k, lib, "spin")) {
        OK_CU(cuLibraryUnload, lib);
        return;
    }
    check_handle("kernel", k);
    CHECK_CU(CUDA_ERROR_NOT_FOUND, cuLibraryGetKernel, &none, lib, "no_such_kernel");
    unsigned count = 0;
    if (OK_CU(cuLibraryGetKernelCount, &count, lib) &&
        CHECK(count == 1, "cuLibraryGetKernelCount = %u", count)) {
        CUkernel all[1] = {NULL};
        if (OK_CU(cuLibraryEnumerateKernels, all, 1, lib))
            CHECK(all[0] == k, "cuLibraryEnumerateKernels lists the kernel cuLibraryGetKernel gave");
    }
    const char *name = NULL;
    if (OK_CU(cuKernelGetName, &name, k))
        CHECK(name && !strcmp(name, "spin"), "cuKernelGetName = %s", name ? name : "(null)");
    CUlibrary owner = NULL;
    if (OK_CU(cuKernelGetLibrary, &owner, k))
        CHECK(owner == lib, "cuKernelGetLibrary is the loading library");
    int v = -1;
    if (OK_CU(cuKernelGetAttribute, &v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, k, dev))
        CHECK(v >= 32 && v <= 1024, "kernel MAX_THREADS_PER_BLOCK = %d", v);
    CUdeviceptr gp = 0;
    size_t gb = 0;
    CHECK_CU(CUDA_ERROR_NOT_FOUND, cuLibraryGetGlobal, &gp, &gb, lib, "no_such_global");
    CUfunction fn = NULL, again = NULL;
    if (OK_CU(cuKernelGetFunction, &fn, k)) {
        check_handle("function of a kernel", fn);
        if (OK_CU(cuKernelGetFunction, &again, k))
            CHECK(again == fn, "cuKernelGetFunction gives one function per context");
        const char *fname = NULL;
        if (OK_CU(cuFuncGetName, &fname, fn))
            CHECK(fname && !strcmp(fname, "spin"), "its function is spin (%s)", fname ? fname : "(null)");
        CUmodule mod = NULL;
        CUfunction mf = NULL;
        if (OK_CU(cuLibraryGetModule, &mod, lib) && OK_CU(cuModuleGetFunction, &mf, mod, "spin"))
            CHECK(mf == fn, "the library's module in this context holds that function");
    }
    CUevent a, b;
    CU(cuEventCreate, &a, CU_EVENT_DEFAULT);
    CU(cuEventCreate, &b, CU_EVENT_DEFAULT);
    uint64_t ns = 1000000;
    void *args[] = {&ns};
    OK_CU(cuEventRecord, a, 0);
    OK_CU(cuLaunchKernel, (CUfunction)k, 4, 1, 1, 128, 1, 1, 0, 0, args, NULL);
    if (fn)
        OK_CU(cuLaunchKernel, fn, 4, 1, 1, 128, 1, 1, 0, 0, args, NULL);
    OK_CU(cuEventRecord, b, 0);
    OK_CU(cuEventSynchronize, b);
    float ms = -1;
    if (OK_CU(cuEventElapsedTime, &ms, a, b))
        CHECK(ms > 0.0f, "a library's kernel ran, as a CUkernel and as a CUfunction (%.3f ms)", ms);
    cuEventDestroy_v2(a);
    cuEventDestroy_v2(b);
    OK_CU(cuLibraryUnload, lib);
    /* A real driver's handles are pointers: using one after the unload is
     * not something to try there. The simulator's are checked. */
    if (getenv("VGPU_SIM_DIR")) {
        CHECK_CU(CUDA_ERROR_INVALID_HANDLE, cuLibraryGetKernel, &none, lib, "spin");
        CHECK_CU(CUDA_ERROR_INVALID_HANDLE, cuKernelGetFunction, &again, k);
        CHECK_CU(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel, (CUfunction)k, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL);
        if (fn)
            CHECK_CU(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel, fn, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL);
    }
}

static void test_link(void) {
    CUlinkState st = NULL;
    if (!OK_CU(cuLinkCreate_v2, 0, NULL, NULL, &st))
        return;
    if (OK_CU(cuLinkAddData_v2, st, CU_JIT_INPUT_PTX, (void *)SPIN_PTX, sizeof SPIN_PTX, "spin.ptx", 0, NULL, NULL)) {
        void *cubin = NULL;
        size_t size = 0;
        if (OK_CU(cuLinkComplete, st, &cubin, &size)) {
            CHECK(cubin != NULL && size > 0, "cuLinkComplete gives an image (%zu bytes)", size);
            CUmodule mod;
            CUfunction fn;
            if (OK_CU(cuModuleLoadData, &mod, cubin)) {
                if (OK_CU(cuModuleGetFunction, &fn, mod, "spin")) {
                    uint64_t ns = 100000;
                    void *args[] = {&ns};
                    OK_CU(cuLaunchKernel, fn, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL);
                    OK_CU(cuCtxSynchronize);
                }
                OK_CU(cuModuleUnload, mod);
            }
        }
    }
    OK_CU(cuLinkDestroy, st);
}

static cuuint64_t graph_mem(CUdevice dev, CUgraphMem_attribute a) {
    cuuint64_t v = 0;
    return CU(cuDeviceGetGraphMemAttribute, dev, a, &v) == CUDA_SUCCESS ? v : ~0ull;
}

/* Stream-ordered allocation in a graph: the memory exists (and counts as
 * device memory) from the alloc node on; freed, it stays reserved by the
 * graph allocator (cuda.h: cached "for use with graphs") until
 * cuDeviceGraphMemTrim gives it back. */
static void test_graph_memory(CUdevice dev) {
    CUgraph ga = NULL, gf = NULL;
    if (!OK_CU(cuGraphCreate, &ga, 0) || !OK_CU(cuGraphCreate, &gf, 0))
        return;
    check_handle("graph", ga);
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = dev;
    p.bytesize = 64 * MiB;
    CUgraphNode an = NULL, fnode = NULL;
    if (!OK_CU(cuGraphAddMemAllocNode, &an, ga, NULL, 0, &p))
        return;
    CHECK(p.dptr != 0, "the alloc node's address is fixed at creation");
    CUDA_MEM_ALLOC_NODE_PARAMS q;
    memset(&q, 0, sizeof q);
    if (OK_CU(cuGraphMemAllocNodeGetParams, an, &q))
        CHECK(q.dptr == p.dptr && q.bytesize == p.bytesize, "cuGraphMemAllocNodeGetParams reads it back");
    OK_CU(cuGraphAddMemFreeNode, &fnode, gf, NULL, 0, p.dptr);
    CUgraphExec ea = NULL, ef = NULL;
    if (!OK_CU(cuGraphInstantiateWithFlags, &ea, ga, 0) || !OK_CU(cuGraphInstantiateWithFlags, &ef, gf, 0))
        return;
    size_t before = free_mem();
    OK_CU(cuGraphLaunch, ea, 0);
    OK_CU(cuCtxSynchronize);
    CHECK(before - free_mem() >= 64 * MiB, "after the alloc node runs, its memory is in use (%zu MiB)",
          (size_t)((before - free_mem()) / MiB));
    cuuint64_t used = 0;
    if (OK_CU(cuDeviceGetGraphMemAttribute, dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used))
        CHECK(used >= 64 * MiB, "CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = %llu", (unsigned long long)used);
    uint32_t x = 0x600df00d, y = 0;
    OK_CU(cuMemcpyHtoD_v2, p.dptr + 4096, &x, 4);
    OK_CU(cuMemcpyDtoH_v2, &y, p.dptr + 4096, 4);
    CHECK(y == x, "graph memory holds bytes");
    OK_CU(cuGraphLaunch, ef, 0);
    OK_CU(cuCtxSynchronize);
    CHECK(graph_mem(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) >= 64 * MiB,
          "after the free node runs, the graph allocator keeps the memory reserved (%llu)",
          (unsigned long long)graph_mem(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
    OK_CU(cuGraphExecDestroy, ea);
    OK_CU(cuGraphExecDestroy, ef);
    OK_CU(cuGraphDestroy, ga);
    OK_CU(cuGraphDestroy, gf);
    OK_CU(cuDeviceGraphMemTrim, dev);
    CHECK(graph_mem(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0,
          "cuDeviceGraphMemTrim gives the unused graph memory back (reserved %llu)",
          (unsigned long long)graph_mem(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
    CHECK(free_mem() >= before, "after the trim the device has it back");
}

/* A stream-ordered allocation captured into an existing graph
 * (cuStreamBeginCaptureToGraph, CUDA 12.3) is an alloc node, not an
 * allocation: nothing is reserved until the graph runs. */
static void test_captured_graph_memory(CUdevice dev) {
    CUstream s = NULL;
    CUgraph g = NULL, got = NULL;
    if (!OK_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING) || !OK_CU(cuGraphCreate, &g, 0))
        return;
    cuuint64_t res0 = graph_mem(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
    size_t before = free_mem();
    CUdeviceptr d = 0;
    if (!OK_CU(cuStreamBeginCaptureToGraph, s, g, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL))
        return;
    OK_CU(cuMemAllocAsync, &d, 32 * MiB, s);
    OK_CU(cuMemFreeAsync, d, s);
    OK_CU(cuStreamEndCapture, s, &got);
    CHECK(got == g, "the capture ends into the graph it began in");
    CHECK(d != 0 && free_mem() + 2 * MiB >= before, "a captured cuMemAllocAsync takes no memory (%zu MiB)",
          (size_t)((before - free_mem()) / MiB));
    size_t n = 8;
    CUgraphNode nodes[8];
    CUgraphNodeType t0 = CU_GRAPH_NODE_TYPE_EMPTY, t1 = CU_GRAPH_NODE_TYPE_EMPTY;
    if (OK_CU(cuGraphGetNodes, g, nodes, &n) && n == 2) {
        OK_CU(cuGraphNodeGetType, nodes[0], &t0);
        OK_CU(cuGraphNodeGetType, nodes[1], &t1);
    }
    CHECK(n == 2 && t0 == CU_GRAPH_NODE_TYPE_MEM_ALLOC && t1 == CU_GRAPH_NODE_TYPE_MEM_FREE,
          "captured cuMemAllocAsync/cuMemFreeAsync are memory nodes (%zu nodes, types %d %d)", n, (int)t0,
          (int)t1);
    CUgraphExec e = NULL;
    if (OK_CU(cuGraphInstantiateWithFlags, &e, g, 0)) {
        OK_CU(cuGraphLaunch, e, s);
        OK_CU(cuStreamSynchronize, s);
        CHECK(graph_mem(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) >= res0 + 32 * MiB,
              "its launch backs the allocation from the graph allocator");
        OK_CU(cuGraphExecDestroy, e);
    }
    OK_CU(cuGraphDestroy, g);
    OK_CU(cuStreamDestroy_v2, s);
    OK_CU(cuDeviceGraphMemTrim, dev);
    CHECK(graph_mem(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == 0, "trimmed again");
}

int main(void) {
    g_prog = "cuda_query";
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUdevice dev;
    CUcontext ctx = NULL;
    int n = 0;
    if (!OK_CU(cuInit, 0) || !OK_CU(cuDeviceGetCount, &n) || !OK_CU(cuDeviceGet, &dev, 0) ||
        !OK_CU(cuDevicePrimaryCtxRetain, &ctx, dev) || !OK_CU(cuCtxSetCurrent, ctx))
        return finish();
    check_handle("context", ctx);
    test_streams(ctx);
    test_limits();
    test_devices(n);
    OK_CU(cuCtxSetCurrent, ctx);
    test_jit();
    test_link();
    test_library(dev);
    test_graph_memory(dev);
    test_captured_graph_memory(dev);
    OK_CU(cuDevicePrimaryCtxRelease_v2, dev);
    return finish();
}
