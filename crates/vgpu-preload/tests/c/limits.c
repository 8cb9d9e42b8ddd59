/* Memory-limit client for libvgpu.so, built against NVIDIA's cuda.h/nvml.h
 * and linked -lcuda -lnvidia-ml like any CUDA program. The Rust tests in
 * crates/vgpu-preload/tests run it under LD_PRELOAD=libvgpu.so on the
 * simulated driver.
 *
 *   limits routes LIMIT    every policy hook through each escape route
 *                          (direct, dlsym, cuGetProcAddress_v2 old/new)
 *   limits fill LIMIT      to the limit, one byte more (OOM), free, again
 *   limits grab CHUNK [pool]
 *                          wait for a byte on stdin, allocate CHUNKs until
 *                          refused (from an own pool that keeps its memory
 *                          with `pool`), print the total, hold until stdin EOF
 *   limits fork CHUNK      allocate, fork; the child allocates on its own
 *   limits view            cuMemGetInfo/cuDeviceTotalMem per device, NVML view
 *   limits nvml [HOLD]     the NVML view only (no CUDA call); HOLD=1 waits
 *                          for stdin EOF before exiting
 *   limits threads LIMIT   8 threads allocate and free concurrently; the
 *                          ledger never passes the limit and ends at zero
 *   limits poolsync BYTES HOW
 *                          allocate BYTES from an own pool (release
 *                          threshold 0), free, synchronize HOW (stream,
 *                          stream_ptsz, ctx, event), print `synced=1`, hold
 *                          until stdin EOF
 *
 * Usage is measured through the direct cuMemGetInfo_v2 (used = total -
 * free, the container's ledger as the interposer presents it).
 */
#define _GNU_SOURCE
#define CHECK_CUDA
#define CHECK_NVML
#include "check.h"

#include <cuda.h>
#include <dlfcn.h>
#include <nvml.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

static void *g_cuda;

static CUresult (*pGetProc)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static size_t used_now(void) {
    size_t f = 0, t = 0;
    if (cuMemGetInfo(&f, &t) != CUDA_SUCCESS)
        return (size_t)-1;
    return t - f;
}

static const char *obj_of(void *p) {
    Dl_info di;
    if (p && dladdr(p, &di) && di.dli_fname)
        return di.dli_fname;
    return "?";
}

typedef struct {
    const char *name;
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*free_)(CUdeviceptr);
    CUresult (*async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*async_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async_ptsz)(CUdeviceptr, CUstream);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*array)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*array3d)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*array_destroy)(CUarray);
    CUresult (*mip)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
    CUresult (*mip_destroy)(CUmipmappedArray);
    CUresult (*ctx_v2)(CUcontext *, unsigned int, CUdevice);
    CUresult (*ctx_v4)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*prim_release)(CUdevice);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*total)(size_t *, CUdevice);
    /* Resolved only to check they are hooks (not called). */
    void *prim_release_v1, *reset_v1, *reset_v2, *ctx_v3, *launch, *launch_ptsz, *pool_create, *pool_destroy, *pool_trim;
    void *stream_sync, *stream_sync_ptsz, *ctx_sync, *event_sync;
    /* Graph memory: instantiation, upload, launch, destroy, trim, capture. */
    void *graph_inst, *graph_inst_params, *graph_upload, *graph_launch, *graph_exec_destroy, *graph_trim,
        *capture_to_graph;
} ops_t;

static void *by_dlsym(const char *n) { return dlsym(g_cuda, n); }

static void *by_proc(const char *n, int ver, cuuint64_t flags) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (pGetProc(n, &p, ver, flags, &st) != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS)
        return NULL;
    return p;
}

#define PTSZ CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

/* route: 0 direct, 1 dlsym, 2 proc at the hook's own version, 3 proc at 12090 */
static void resolve(ops_t *o, int route) {
    memset(o, 0, sizeof *o);
    if (route == 0) {
        o->name = "direct";
        o->alloc = cuMemAlloc_v2; o->pitch = cuMemAllocPitch_v2; o->managed = cuMemAllocManaged;
        o->free_ = cuMemFree_v2; o->async = cuMemAllocAsync; o->from_pool = cuMemAllocFromPoolAsync;
        o->free_async = cuMemFreeAsync; o->create = cuMemCreate; o->release = cuMemRelease;
        o->array = cuArrayCreate_v2; o->array3d = cuArray3DCreate_v2; o->array_destroy = cuArrayDestroy;
        o->mip = cuMipmappedArrayCreate; o->mip_destroy = cuMipmappedArrayDestroy;
        o->ctx_v2 = cuCtxCreate_v2; o->ctx_destroy = cuCtxDestroy_v2; o->retain = cuDevicePrimaryCtxRetain;
        o->prim_release = cuDevicePrimaryCtxRelease_v2; o->info = cuMemGetInfo_v2; o->total = cuDeviceTotalMem_v2;
        return;
    }
    if (route == 1) {
        o->name = "dlsym";
#define D(f, n) *(void **)&o->f = by_dlsym(n)
        D(alloc, "cuMemAlloc_v2"); D(pitch, "cuMemAllocPitch_v2"); D(managed, "cuMemAllocManaged");
        D(free_, "cuMemFree_v2"); D(async, "cuMemAllocAsync"); D(from_pool, "cuMemAllocFromPoolAsync");
        D(free_async, "cuMemFreeAsync"); D(async_ptsz, "cuMemAllocAsync_ptsz");
        D(free_async_ptsz, "cuMemFreeAsync_ptsz"); D(create, "cuMemCreate"); D(release, "cuMemRelease");
        D(array, "cuArrayCreate_v2"); D(array3d, "cuArray3DCreate_v2"); D(array_destroy, "cuArrayDestroy");
        D(mip, "cuMipmappedArrayCreate"); D(mip_destroy, "cuMipmappedArrayDestroy");
        D(ctx_v2, "cuCtxCreate_v2"); D(ctx_destroy, "cuCtxDestroy_v2"); D(retain, "cuDevicePrimaryCtxRetain");
        D(prim_release, "cuDevicePrimaryCtxRelease_v2"); D(info, "cuMemGetInfo_v2"); D(total, "cuDeviceTotalMem_v2");
        D(prim_release_v1, "cuDevicePrimaryCtxRelease"); D(reset_v1, "cuDevicePrimaryCtxReset");
        D(reset_v2, "cuDevicePrimaryCtxReset_v2"); D(ctx_v3, "cuCtxCreate_v3"); D(launch, "cuLaunchKernel");
        D(launch_ptsz, "cuLaunchKernel_ptsz"); D(pool_create, "cuMemPoolCreate"); D(pool_destroy, "cuMemPoolDestroy");
        D(pool_trim, "cuMemPoolTrimTo"); D(stream_sync, "cuStreamSynchronize");
        D(stream_sync_ptsz, "cuStreamSynchronize_ptsz"); D(ctx_sync, "cuCtxSynchronize");
        D(event_sync, "cuEventSynchronize");
        D(graph_inst, "cuGraphInstantiateWithFlags"); D(graph_inst_params, "cuGraphInstantiateWithParams");
        D(graph_upload, "cuGraphUpload"); D(graph_launch, "cuGraphLaunch");
        D(graph_exec_destroy, "cuGraphExecDestroy"); D(graph_trim, "cuDeviceGraphMemTrim");
        D(capture_to_graph, "cuStreamBeginCaptureToGraph");
#undef D
        return;
    }
    int nv = route == 3;
    o->name = nv ? "proc-12090" : "proc-old";
#define P(f, n, v) *(void **)&o->f = by_proc(n, nv ? 12090 : (v), 0)
    P(alloc, "cuMemAlloc", 3020); P(pitch, "cuMemAllocPitch", 3020); P(managed, "cuMemAllocManaged", 6000);
    P(free_, "cuMemFree", 3020); P(async, "cuMemAllocAsync", 11020); P(from_pool, "cuMemAllocFromPoolAsync", 11020);
    P(free_async, "cuMemFreeAsync", 11020); P(create, "cuMemCreate", 10020); P(release, "cuMemRelease", 10020);
    P(array, "cuArrayCreate", 3020); P(array3d, "cuArray3DCreate", 3020); P(array_destroy, "cuArrayDestroy", 2000);
    P(mip, "cuMipmappedArrayCreate", 5000); P(mip_destroy, "cuMipmappedArrayDestroy", 5000);
    P(ctx_destroy, "cuCtxDestroy", 4000); P(retain, "cuDevicePrimaryCtxRetain", 7000);
    P(prim_release, "cuDevicePrimaryCtxRelease", 11000); P(info, "cuMemGetInfo", 3020);
    P(total, "cuDeviceTotalMem", 3020);
    if (!nv) {
        P(prim_release_v1, "cuDevicePrimaryCtxRelease", 7000); P(reset_v1, "cuDevicePrimaryCtxReset", 7000);
        P(ctx_v3, "cuCtxCreate", 11040);
    }
    P(reset_v2, "cuDevicePrimaryCtxReset", 11000); P(launch, "cuLaunchKernel", 4000);
    P(pool_create, "cuMemPoolCreate", 11020); P(pool_destroy, "cuMemPoolDestroy", 11020); P(pool_trim, "cuMemPoolTrimTo", 11020);
    *(void **)&o->launch_ptsz = by_proc("cuLaunchKernel", nv ? 12090 : 7000, PTSZ);
    P(stream_sync, "cuStreamSynchronize", 2000); P(ctx_sync, "cuCtxSynchronize", 2000);
    P(event_sync, "cuEventSynchronize", 2000);
    P(graph_inst, "cuGraphInstantiateWithFlags", 11040); P(graph_inst_params, "cuGraphInstantiateWithParams", 12000);
    P(graph_upload, "cuGraphUpload", 11010); P(graph_launch, "cuGraphLaunch", 10000);
    P(graph_exec_destroy, "cuGraphExecDestroy", 10000); P(graph_trim, "cuDeviceGraphMemTrim", 11040);
    P(capture_to_graph, "cuStreamBeginCaptureToGraph", 12030);
    *(void **)&o->stream_sync_ptsz = by_proc("cuStreamSynchronize", nv ? 12090 : 7000, PTSZ);
#undef P
    if (nv)
        *(void **)&o->ctx_v4 = by_proc("cuCtxCreate", 12090, 0);
    else
        *(void **)&o->ctx_v2 = by_proc("cuCtxCreate", 3020, 0);
    *(void **)&o->async_ptsz = by_proc("cuMemAllocAsync", nv ? 12090 : 11020, PTSZ);
    *(void **)&o->free_async_ptsz = by_proc("cuMemFreeAsync", nv ? 12090 : 11020, PTSZ);
}

static int is_ours(void *p) { return strstr(obj_of(p), "libvgpu") != NULL; }

/* The call's charge shows in the ledger (`want` bytes, or at least `want`
 * when `atleast`). */
static void expect_used(const char *route, size_t base, size_t want, int atleast, const char *what) {
    size_t u = used_now() - base;
    CHECK(atleast ? u >= want : u == want, "%s: %s charged %zu (want %s%zu)", route, what, u, atleast ? ">= " : "",
          want);
}
#define EXPECT_USED(base, want, atleast, what) expect_used(o.name, base, want, atleast, what)

/* A pool of our own (cuMemPoolCreate) on the limited device, through the
 * route's pointers: its reserved memory is charged as it grows, growth past
 * the budget is refused, trim and destroy release the charge. */
static void own_pool(const ops_t *op, size_t limit, CUdevice dev, size_t base) {
    ops_t o = *op;
    CUresult (*create)(CUmemoryPool *, const CUmemPoolProps *) = cuMemPoolCreate;
    CUresult (*destroy)(CUmemoryPool) = cuMemPoolDestroy;
    CUresult (*trim)(CUmemoryPool, size_t) = cuMemPoolTrimTo;
    if (o.pool_create)
        *(void **)&create = o.pool_create;
    if (o.pool_destroy)
        *(void **)&destroy = o.pool_destroy;
    if (o.pool_trim)
        *(void **)&trim = o.pool_trim;
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = dev;
    CUmemoryPool pool = NULL;
    CUdeviceptr d = 0, e = 0;
    CHECK(create(&pool, &pp) == CUDA_SUCCESS && pool, "%s: cuMemPoolCreate", o.name);
    if (!pool)
        return;
    size_t room0 = limit - used_now();
    CHECK(o.from_pool && o.from_pool(&d, 3 * MiB, pool, 0) == CUDA_SUCCESS, "%s: cuMemAllocFromPoolAsync", o.name);
    EXPECT_USED(base, 3 * MiB, 1, "cuMemAllocFromPoolAsync (own pool grows)");
    CHECK(o.free_async(d, 0) == CUDA_SUCCESS, "%s: cuMemFreeAsync (own pool)", o.name);
    cuStreamSynchronize(0);
    /* The synchronize released the pool (threshold 0) behind vgpu's back:
     * the whole budget is there for the next allocation, no view asked. */
    CHECK(o.alloc(&e, room0) == CUDA_SUCCESS, "%s: the whole budget after a pool released at synchronize", o.name);
    o.free_(e);
    EXPECT_USED(base, 0, 0, "own pool after free + synchronize (threshold 0)");

    /* Keep freed memory: still charged until trimmed. */
    cuuint64_t keep = ~0ull;
    OK_CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    CHECK(o.from_pool(&d, 5 * MiB, pool, 0) == CUDA_SUCCESS, "%s: cuMemAllocFromPoolAsync 5 MiB", o.name);
    o.free_async(d, 0);
    cuStreamSynchronize(0);
    size_t kept = used_now() - base;
    CHECK(kept >= 5 * MiB, "%s: memory the pool keeps stays charged (%zu)", o.name, kept);
    /* Reuse costs nothing more. */
    CHECK(o.from_pool(&d, 5 * MiB, pool, 0) == CUDA_SUCCESS, "%s: reuse", o.name);
    EXPECT_USED(base, kept, 0, "reuse of kept pool memory");
    o.free_async(d, 0);
    cuStreamSynchronize(0);
    CHECK(trim(pool, 0) == CUDA_SUCCESS, "%s: cuMemPoolTrimTo", o.name);
    EXPECT_USED(base, 0, 0, "cuMemPoolTrimTo(0) releases the charge");

    /* Growth past the budget is refused and charges nothing. */
    size_t room = limit - used_now();
    CHECK(o.from_pool(&d, room + 1, pool, 0) == CUDA_ERROR_OUT_OF_MEMORY,
          "%s: own pool growth one byte past the budget is refused", o.name);
    EXPECT_USED(base, 0, 0, "refused pool growth");
    /* Memory the pool keeps counts: with half the room kept, more than the
     * other half is refused, and the kept half is reused. */
    size_t half = (room / 2) & ~(2 * MiB - 1);
    CHECK(o.from_pool(&d, half, pool, 0) == CUDA_SUCCESS, "%s: half the room from the pool", o.name);
    o.free_async(d, 0);
    cuStreamSynchronize(0);
    CHECK(o.alloc(&e, room - half + 1) == CUDA_ERROR_OUT_OF_MEMORY,
          "%s: kept pool memory leaves only the rest of the budget", o.name);
    CHECK(o.alloc(&e, room - half) == CUDA_SUCCESS, "%s: the rest of the budget", o.name);
    CHECK(o.from_pool(&d, half, pool, 0) == CUDA_SUCCESS, "%s: the kept half is reused at the budget", o.name);
    CHECK(o.from_pool(&d, 2 * MiB, pool, 0) == CUDA_ERROR_OUT_OF_MEMORY, "%s: no growth left", o.name);
    o.free_(e);
    o.free_async(d, 0);
    cuStreamSynchronize(0);

    /* Destroy: the kept memory goes back with the pool. */
    CHECK(used_now() - base >= half, "%s: still kept before destroy", o.name);
    CHECK(destroy(pool) == CUDA_SUCCESS, "%s: cuMemPoolDestroy", o.name);
    EXPECT_USED(base, 0, 0, "cuMemPoolDestroy releases the charge");

    /* Destroyed with an allocation still out: that one stays charged until
     * freed. */
    pool = NULL;
    CHECK(create(&pool, &pp) == CUDA_SUCCESS && pool, "%s: cuMemPoolCreate again", o.name);
    OK_CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    CHECK(o.from_pool(&d, 4 * MiB, pool, 0) == CUDA_SUCCESS, "%s: live allocation", o.name);
    CHECK(o.from_pool(&e, 6 * MiB, pool, 0) == CUDA_SUCCESS, "%s: freed allocation", o.name);
    o.free_async(e, 0);
    cuStreamSynchronize(0);
    EXPECT_USED(base, 10 * MiB, 0, "pool with 4 MiB live and 6 MiB kept");
    CHECK(destroy(pool) == CUDA_SUCCESS, "%s: cuMemPoolDestroy with an allocation out", o.name);
    EXPECT_USED(base, 4 * MiB, 0, "destroyed pool: the live allocation stays charged");
    CHECK(o.free_async(d, 0) == CUDA_SUCCESS, "%s: free of the last allocation", o.name);
    cuStreamSynchronize(0);
    EXPECT_USED(base, 0, 0, "last allocation of a destroyed pool freed");

    /* At the budget's edge the pool may need more than reserved − used
     * promised (it rounds each allocation up): the refused growth leaves
     * the pool holding no more than it is charged for. */
    pool = NULL;
    CHECK(create(&pool, &pp) == CUDA_SUCCESS && pool, "%s: cuMemPoolCreate (edge)", o.name);
    OK_CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    CHECK(o.from_pool(&d, 1 * MiB, pool, 0) == CUDA_SUCCESS, "%s: 1 MiB from the pool", o.name);
    size_t charged = used_now() - base;
    cuuint64_t res = 0;
    OK_CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
    CHECK(charged == res, "%s: the pool's charge is its reserved memory (%zu, %llu)", o.name, charged,
          (unsigned long long)res);
    CHECK(o.alloc(&e, limit - used_now()) == CUDA_SUCCESS, "%s: the rest of the budget", o.name);
    CUdeviceptr d2 = 0;
    CHECK(o.from_pool(&d2, 1 * MiB, pool, 0) == CUDA_ERROR_OUT_OF_MEMORY, "%s: growth at the edge is refused",
          o.name);
    OK_CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
    CHECK(res <= charged, "%s: the refused growth left the pool within its charge (%llu <= %zu)", o.name,
          (unsigned long long)res, charged);
    CHECK(used_now() == limit, "%s: the budget is exactly full (%zu)", o.name, used_now());
    o.free_(e);
    o.free_async(d, 0);
    cuStreamSynchronize(0);
    CHECK(destroy(pool) == CUDA_SUCCESS, "%s: cuMemPoolDestroy (edge)", o.name);
    EXPECT_USED(base, 0, 0, "edge pool destroyed");

    /* A pool in host memory takes no device memory: not charged, not
     * limited by the device budget. */
    CUmemPoolProps hp = pp;
    hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    hp.location.id = 0;
    pool = NULL;
    CHECK(create(&pool, &hp) == CUDA_SUCCESS && pool, "%s: cuMemPoolCreate (host NUMA)", o.name);
    CHECK(o.from_pool(&d, limit + 2 * MiB, pool, 0) == CUDA_SUCCESS, "%s: more than the budget from a host pool",
          o.name);
    EXPECT_USED(base, 0, 0, "host pool allocation");
    CHECK(o.free_async(d, 0) == CUDA_SUCCESS, "%s: free to the host pool", o.name);
    cuStreamSynchronize(0);
    CHECK(destroy(pool) == CUDA_SUCCESS, "%s: cuMemPoolDestroy (host)", o.name);
    EXPECT_USED(base, 0, 0, "host pool destroyed");
}

static void routes(size_t limit, CUdevice dev) {
    for (int route = 0; route < 4; route++) {
        ops_t o;
        resolve(&o, route);
        void **fp = (void **)&o.alloc;
        int n = (int)((sizeof o - offsetof(ops_t, alloc)) / sizeof(void *));
        for (int i = 0; i < n; i++) {
            if (!fp[i])
                continue;
            CHECK(is_ours(fp[i]), "%s: pointer %d resolves into libvgpu.so (got %s)", o.name, i, obj_of(fp[i]));
        }
        size_t base = used_now();
        CUdeviceptr d = 0;
        size_t pitch = 0;

        CHECK(o.alloc && o.alloc(&d, 3 * MiB) == CUDA_SUCCESS, "%s: cuMemAlloc_v2", o.name);
        EXPECT_USED(base, 3 * MiB, 0, "cuMemAlloc_v2");
        CHECK(o.free_ && o.free_(d) == CUDA_SUCCESS, "%s: cuMemFree_v2", o.name);
        EXPECT_USED(base, 0, 0, "cuMemFree_v2");

        CHECK(o.pitch && o.pitch(&d, &pitch, 1000, 100, 4) == CUDA_SUCCESS, "%s: cuMemAllocPitch_v2", o.name);
        EXPECT_USED(base, pitch * 100, 0, "cuMemAllocPitch_v2 (pitch x height)");
        o.free_(d);
        EXPECT_USED(base, 0, 0, "free of pitched");

        CHECK(o.managed && o.managed(&d, 5 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS, "%s: cuMemAllocManaged", o.name);
        EXPECT_USED(base, 5 * MiB, 0, "cuMemAllocManaged");
        o.free_(d);
        EXPECT_USED(base, 0, 0, "free of managed");

        CUmemoryPool dpool = NULL;
        OK_CU(cuDeviceGetMemPool, &dpool, dev);
        CHECK(o.async && o.async(&d, 3 * MiB, 0) == CUDA_SUCCESS, "%s: cuMemAllocAsync", o.name);
        EXPECT_USED(base, 3 * MiB, 1, "cuMemAllocAsync (pool growth)");
        CHECK(o.free_async && o.free_async(d, 0) == CUDA_SUCCESS, "%s: cuMemFreeAsync", o.name);
        cuStreamSynchronize(0);
        /* Release threshold 0: the synchronize gave it back; the view settles. */
        EXPECT_USED(base, 0, 0, "cuMemFreeAsync + synchronize (default pool)");
        if (o.async_ptsz) {
            CHECK(o.async_ptsz(&d, 3 * MiB, 0) == CUDA_SUCCESS, "%s: cuMemAllocAsync_ptsz", o.name);
            EXPECT_USED(base, 3 * MiB, 1, "cuMemAllocAsync_ptsz");
            CHECK(o.free_async_ptsz && o.free_async_ptsz(d, 0) == CUDA_SUCCESS, "%s: cuMemFreeAsync_ptsz", o.name);
            cuStreamSynchronize(0);
            EXPECT_USED(base, 0, 0, "cuMemFreeAsync_ptsz + synchronize");
        }
        own_pool(&o, limit, dev, base);

        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        size_t gran = 2 * MiB;
        cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        CUmemGenericAllocationHandle h = 0;
        CHECK(o.create && o.create(&h, 2 * gran, &prop, 0) == CUDA_SUCCESS, "%s: cuMemCreate", o.name);
        EXPECT_USED(base, 2 * gran, 0, "cuMemCreate");
        CHECK(o.release && o.release(h) == CUDA_SUCCESS, "%s: cuMemRelease", o.name);
        EXPECT_USED(base, 0, 0, "cuMemRelease");

        CUDA_ARRAY_DESCRIPTOR ad = {.Width = 256, .Height = 128, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 2};
        CUarray arr = NULL;
        CHECK(o.array && o.array(&arr, &ad) == CUDA_SUCCESS, "%s: cuArrayCreate_v2", o.name);
        EXPECT_USED(base, 256 * 128 * 2 * 4, 0, "cuArrayCreate_v2");
        CHECK(o.array_destroy && o.array_destroy(arr) == CUDA_SUCCESS, "%s: cuArrayDestroy", o.name);
        EXPECT_USED(base, 0, 0, "cuArrayDestroy");
        CUDA_ARRAY3D_DESCRIPTOR a3 = {.Width = 64, .Height = 32, .Depth = 8, .Format = CU_AD_FORMAT_UNSIGNED_INT16, .NumChannels = 4};
        CHECK(o.array3d && o.array3d(&arr, &a3) == CUDA_SUCCESS, "%s: cuArray3DCreate_v2", o.name);
        EXPECT_USED(base, 64 * 32 * 8 * 4 * 2, 0, "cuArray3DCreate_v2");
        o.array_destroy(arr);
        EXPECT_USED(base, 0, 0, "3D array destroyed");
        CUDA_ARRAY3D_DESCRIPTOR mm = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CUmipmappedArray mip = NULL;
        CHECK(o.mip && o.mip(&mip, &mm, 3) == CUDA_SUCCESS, "%s: cuMipmappedArrayCreate", o.name);
        EXPECT_USED(base, (64 * 64 + 32 * 32 + 16 * 16) * 4, 0, "cuMipmappedArrayCreate (3 levels)");
        CHECK(o.mip_destroy && o.mip_destroy(mip) == CUDA_SUCCESS, "%s: cuMipmappedArrayDestroy", o.name);
        EXPECT_USED(base, 0, 0, "cuMipmappedArrayDestroy");

        /* Context estimate: LIBVGPU_CONTEXT_MEMORY is 8 MiB in this test. */
        CUcontext cur = NULL, c = NULL;
        cuCtxGetCurrent(&cur);
        CUresult r = o.ctx_v4 ? o.ctx_v4(&c, NULL, 0, dev) : o.ctx_v2 ? o.ctx_v2(&c, 0, dev) : NOT_EXPORTED;
        CHECK(r == CUDA_SUCCESS, "%s: cuCtxCreate (%s) -> %u", o.name, o.ctx_v4 ? "v4" : "v2", r);
        EXPECT_USED(base, 8 * MiB, 0, "cuCtxCreate");
        CHECK(o.ctx_destroy && o.ctx_destroy(c) == CUDA_SUCCESS, "%s: cuCtxDestroy_v2", o.name);
        EXPECT_USED(base, 0, 0, "cuCtxDestroy_v2");
        if (o.ctx_v3) {
            CUresult (*v3)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
            *(void **)&v3 = o.ctx_v3;
            CHECK(v3(&c, NULL, 0, 0, dev) == CUDA_SUCCESS, "%s: cuCtxCreate_v3", o.name);
            EXPECT_USED(base, 8 * MiB, 0, "cuCtxCreate_v3");
            o.ctx_destroy(c);
            EXPECT_USED(base, 0, 0, "destroy of the v3 context");
        }
        cuCtxSetCurrent(cur);
        CUcontext pc = NULL;
        CHECK(o.retain && o.retain(&pc, dev) == CUDA_SUCCESS, "%s: second primary retain", o.name);
        EXPECT_USED(base, 0, 0, "second primary retain (already charged)");
        CHECK(o.prim_release && o.prim_release(dev) == CUDA_SUCCESS, "%s: primary release", o.name);
        EXPECT_USED(base, 0, 0, "primary release (still retained once)");

        /* The budget, exactly. */
        size_t room = limit - used_now();
        CHECK(o.alloc(&d, room + 1) == CUDA_ERROR_OUT_OF_MEMORY, "%s: one byte over the budget is refused", o.name);
        CHECK(o.alloc(&d, room) == CUDA_SUCCESS, "%s: exactly the budget is admitted", o.name);
        o.free_(d);

        size_t f = 0, t = 0, dt = 0;
        CHECK(o.info && o.info(&f, &t) == CUDA_SUCCESS && t == limit, "%s: cuMemGetInfo_v2 total %zu == limit", o.name, t);
        CHECK(o.total && o.total(&dt, dev) == CUDA_SUCCESS && dt == limit, "%s: cuDeviceTotalMem_v2 %zu == limit", o.name, dt);
    }

    /* Pass-through: a no-policy name and an unknown name. */
    void *p = dlsym(g_cuda, "cuDeviceGetCount");
    CHECK(p && !is_ours(p), "dlsym(cuDeviceGetCount) is the driver's (%s)", obj_of(p));
    p = by_proc("cuDeviceGetCount", 12090, 0);
    CHECK(p && !is_ours(p), "cuGetProcAddress_v2(cuDeviceGetCount) is the driver's (%s)", obj_of(p));
    p = by_proc("cuModuleLoad", 12090, 0);
    CHECK(p && !is_ours(p), "cuGetProcAddress_v2(cuModuleLoad) is the driver's (%s)", obj_of(p));
    /* cuGraphLaunch is paced now: the hook on every route. */
    p = by_proc("cuGraphLaunch", 12090, 0);
    CHECK(p && is_ours(p), "cuGetProcAddress_v2(cuGraphLaunch) is the hook (%s)", obj_of(p));
    p = dlsym(g_cuda, "cuGraphLaunch");
    CHECK(p && is_ours(p), "dlsym(cuGraphLaunch) is the hook (%s)", obj_of(p));
    CHECK(dlsym(g_cuda, "cuNoSuchEntryPoint") == NULL, "dlsym of an unknown name is NULL");
    void *q = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = pGetProc("cuNoSuchEntryPoint", &q, 12090, 0, &st);
    CHECK(r == CUDA_ERROR_NOT_FOUND && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
          "unknown name via cuGetProcAddress_v2: %u / status %d", r, (int)st);
    /* v1 cuMemAlloc (32-bit ABI) is hooked too: our pointer. */
    p = by_proc("cuMemAlloc", 2000, 0);
    CHECK(p && is_ours(p), "cuMemAlloc@2000 (v1 ABI) is the hook (%s)", obj_of(p));
}

static void fill(size_t limit) {
    CUdeviceptr a = 0, b = 0;
    size_t room = limit - used_now();
    printf("room=%zu\n", room);
    CHECK_CU(CUDA_SUCCESS, cuMemAlloc, &a, room);
    CHECK_CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc, &b, 1);
    OK_CU(cuMemFree, a);
    CHECK_CU(CUDA_SUCCESS, cuMemAlloc, &a, room);
    CHECK_CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc, &b, 1);
    OK_CU(cuMemFree, a);
    CHECK(used_now() == limit - room, "all released");

    /* Pitched allocation whose width x height fits the room exactly but
     * whose returned pitch does not: refused after the fact, the driver's
     * allocation freed, nothing left charged. */
    size_t pitch = 0;
    CUdeviceptr p = 0;
    size_t width = 1000, height = room / width;
    if (cuMemAllocPitch(&p, &pitch, width, 1, 4) == CUDA_SUCCESS) {
        cuMemFree(p);
        printf("pitch_for_1000=%zu\n", pitch);
        if (pitch > width) {
            size_t before = used_now();
            CHECK_CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocPitch, &p, &pitch, width, height, 4);
            CHECK(used_now() == before, "a refused pitched allocation leaves no charge (%zu)", used_now() - before);
            CHECK_CU(CUDA_SUCCESS, cuMemAlloc, &a, room);
            OK_CU(cuMemFree, a);
        }
    }
}

/* The pool gives its memory back at the synchronize; the charge must
 * follow there and then, for the other processes sharing the budget. */
static void poolsync(size_t bytes, const char *how) {
    CUdevice dev = 0;
    cuCtxGetDevice(&dev);
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = dev;
    CUmemoryPool pool = NULL;
    CUdeviceptr d = 0;
    CUstream s = NULL;
    CUevent ev = NULL;
    if (!OK_CU(cuMemPoolCreate, &pool, &pp) || !OK_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING) ||
        !OK_CU(cuEventCreate, &ev, 0))
        return;
    OK_CU(cuMemAllocFromPoolAsync, &d, bytes, pool, s);
    OK_CU(cuMemFreeAsync, d, s);
    if (!strcmp(how, "stream"))
        OK_CU(cuStreamSynchronize, s);
    else if (!strcmp(how, "stream_ptsz")) {
        CUresult (*f)(CUstream) = NULL;
        *(void **)&f = by_proc("cuStreamSynchronize", 12090, PTSZ);
        CHECK(f && is_ours((void *)f), "cuStreamSynchronize_ptsz resolves to the hook");
        if (f)
            CHECK(f(s) == CUDA_SUCCESS, "cuStreamSynchronize_ptsz");
    } else if (!strcmp(how, "ctx"))
        OK_CU(cuCtxSynchronize);
    else if (!strcmp(how, "event")) {
        OK_CU(cuEventRecord, ev, s);
        OK_CU(cuEventSynchronize, ev);
    } else
        CHECK(0, "unknown synchronize %s", how);
    printf("synced=1\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    cuMemPoolDestroy(pool);
}

/* With `pool`: from a pool of its own that keeps what it reserves
 * (release threshold max); also prints the pool's reserved memory. */
static void grab(size_t chunk, const char *mode) {
    int from_pool = !strcmp(mode, "pool");
    CUmemoryPool pool = NULL;
    if (from_pool) {
        CUdevice dev = 0;
        cuCtxGetDevice(&dev);
        CUmemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = dev;
        cuuint64_t keep = ~0ull;
        if (!OK_CU(cuMemPoolCreate, &pool, &pp) ||
            !OK_CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep))
            return;
    }
    char c;
    if (read(0, &c, 1) != 1)
        return;
    size_t got = 0;
    CUdeviceptr d;
    while ((from_pool ? cuMemAllocFromPoolAsync(&d, chunk, pool, 0) : cuMemAlloc(&d, chunk)) == CUDA_SUCCESS)
        got += chunk;
    if (from_pool) {
        cuuint64_t res = 0;
        OK_CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
        printf("reserved=%llu\n", (unsigned long long)res);
    }
    printf("grabbed=%zu\n", got);
    fflush(stdout);
    while (read(0, &c, 1) > 0) {
    }
}

/* Fork after init: the child cannot use the parent's CUDA (the driver
 * refuses, as a real one does), but its first hooked call registers it in
 * its own slot with its own (empty) accounting. The harness inspects the
 * region while the child waits on stdin. */
static void forked(size_t chunk) {
    CUdeviceptr d;
    size_t base = used_now();
    OK_CU(cuMemAlloc, &d, 2 * chunk);
    printf("parent_pid=%d\n", (int)getpid());
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CUdeviceptr e;
        CUresult r = cuMemAlloc(&e, chunk);
        printf("child_pid=%d\nchild_alloc_rc=%d\nchild_waiting=1\n", (int)getpid(), (int)r);
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0) {
        }
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exited cleanly");
    CHECK(used_now() - base == 2 * chunk, "after the child exits the parent's charge is its own (%zu)", used_now() - base);
    OK_CU(cuMemFree, d);
}

static size_t g_limit;
static volatile int g_over;
static size_t g_held, g_ooms, g_allocs, g_frees, g_max_held;
static pthread_barrier_t g_start;

/* Each thread adds what it holds after a granted allocation and takes it
 * off before freeing, so g_held never exceeds what the ledger admitted:
 * over the limit means the admission over-committed. */
static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    CUcontext ctx = NULL;
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    CUdeviceptr held[16] = {0};
    size_t size[16] = {0};
    pthread_barrier_wait(&g_start);
    for (int i = 0; i < 4000; i++) {
        int k = (int)(rand_r(&seed) % 16);
        if (held[k]) {
            __atomic_sub_fetch(&g_held, size[k], __ATOMIC_SEQ_CST);
            if (cuMemFree(held[k]) != CUDA_SUCCESS)
                g_over = 2;
            __atomic_add_fetch(&g_frees, 1, __ATOMIC_SEQ_CST);
            held[k] = 0;
        } else {
            size_t n = (1 + rand_r(&seed) % 8) * MiB;
            CUresult r = cuMemAlloc(&held[k], n);
            if (r == CUDA_SUCCESS) {
                __atomic_add_fetch(&g_allocs, 1, __ATOMIC_SEQ_CST);
                size[k] = n;
                size_t now = __atomic_add_fetch(&g_held, n, __ATOMIC_SEQ_CST);
                size_t m = __atomic_load_n(&g_max_held, __ATOMIC_SEQ_CST);
                while (now > m && !__atomic_compare_exchange_n(&g_max_held, &m, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                }
                if (now > g_limit)
                    g_over = 1;
            } else {
                held[k] = 0;
                if (r == CUDA_ERROR_OUT_OF_MEMORY)
                    __atomic_add_fetch(&g_ooms, 1, __ATOMIC_SEQ_CST);
                else
                    g_over = 3;
            }
        }
    }
    for (int k = 0; k < 16; k++)
        if (held[k]) {
            __atomic_sub_fetch(&g_held, size[k], __ATOMIC_SEQ_CST);
            cuMemFree(held[k]);
        }
    cuDevicePrimaryCtxRelease(0);
    return NULL;
}

static void threads(size_t limit) {
    g_limit = limit;
    size_t base = used_now();
    pthread_t t[8];
    pthread_barrier_init(&g_start, NULL, 8);
    for (uintptr_t i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, churn, (void *)(i + 1));
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    printf("threads.allocs=%zu\nthreads.frees=%zu\nthreads.refusals=%zu\nthreads.max_held=%zu\nthreads.limit=%zu\n", g_allocs,
           g_frees, g_ooms, g_max_held, g_limit);
    CHECK(g_over == 0, "held memory never passed the limit, no call failed oddly (%d)", g_over);
    CHECK(g_ooms > 0, "the threads pressed against the limit (%zu refusals)", g_ooms);
    CHECK(used_now() == base, "everything released (%zu left)", used_now() - base);
}

/* Two devices: an allocation made while device 1's context is current is
 * charged to device 1, not 0. */
static void twodev(size_t chunk) {
    CUcontext c0 = NULL, c1 = NULL;
    CUdevice d1;
    CUdeviceptr p;
    OK_CU(cuDeviceGet, &d1, 1);
    OK_CU(cuCtxGetCurrent, &c0);
    OK_CU(cuDevicePrimaryCtxRetain, &c1, d1);
    OK_CU(cuCtxSetCurrent, c1);
    size_t base1 = used_now();
    cuCtxSetCurrent(c0);
    size_t base0 = used_now();
    cuCtxSetCurrent(c1);
    OK_CU(cuMemAlloc, &p, chunk);
    CHECK(used_now() - base1 == chunk, "device 1 charged %zu", used_now() - base1);
    cuCtxSetCurrent(c0);
    CHECK(used_now() == base0, "device 0 untouched (%zu)", used_now() - base0);
    cuCtxSetCurrent(c1);
    OK_CU(cuMemFree, p);
    CHECK(used_now() == base1, "device 1 released");

    /* Stream-ordered: device 1's own default pool, then a pool created
     * for device 1 while device 0 is current. */
    OK_CU(cuMemAllocAsync, &p, chunk, 0);
    CHECK(used_now() - base1 >= chunk, "device 1's default pool charged to device 1 (%zu)", used_now() - base1);
    cuCtxSetCurrent(c0);
    CHECK(used_now() == base0, "device 0 untouched by device 1's pool (%zu)", used_now() - base0);
    cuCtxSetCurrent(c1);
    OK_CU(cuMemFreeAsync, p, 0);
    OK_CU(cuStreamSynchronize, 0);
    CHECK(used_now() == base1, "device 1's default pool released at synchronize");
    cuCtxSetCurrent(c0);
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = d1;
    CUmemoryPool pool = NULL;
    if (OK_CU(cuMemPoolCreate, &pool, &pp)) {
        cuCtxSetCurrent(c1);
        OK_CU(cuMemAllocFromPoolAsync, &p, chunk, pool, 0);
        CHECK(used_now() - base1 >= chunk, "own pool of device 1 charged to device 1 (%zu)", used_now() - base1);
        cuCtxSetCurrent(c0);
        CHECK(used_now() == base0, "device 0 untouched by the own pool (%zu)", used_now() - base0);
        cuCtxSetCurrent(c1);
        OK_CU(cuMemFreeAsync, p, 0);
        cuCtxSetCurrent(c0);
        OK_CU(cuMemPoolDestroy, pool);
        cuCtxSetCurrent(c1);
        CHECK(used_now() == base1, "device 1 released with its pool (%zu)", used_now() - base1);
    }
    cuCtxSetCurrent(c0);
    cuDevicePrimaryCtxRelease(d1);
}

static void nvml_view(void);

static void view(void) {
    int n = 0;
    cuDeviceGetCount(&n);
    printf("cuda.count=%d\n", n);
    for (int i = 0; i < n; i++) {
        CUdevice d;
        CUcontext c;
        cuDeviceGet(&d, i);
        CUuuid u;
        cuDeviceGetUuid(&u, d);
        printf("cuda.%d.uuid=GPU-", i);
        for (int k = 0; k < 16; k++)
            printf("%02x%s", (unsigned char)u.bytes[k], (k == 3 || k == 5 || k == 7 || k == 9) ? "-" : "");
        printf("\n");
        size_t t = 0, f = 0, tt = 0;
        cuDeviceTotalMem(&t, d);
        cuDevicePrimaryCtxRetain(&c, d);
        cuCtxSetCurrent(c);
        cuMemGetInfo(&f, &tt);
        printf("cuda.%d.total_mem=%zu\ncuda.%d.info_total=%zu\ncuda.%d.info_free=%zu\n", i, t, i, tt, i, f);
    }
    nvml_view();
}

static void nvml_view(void) {
    if (nvmlInit_v2() != NVML_SUCCESS) {
        printf("nvml.error=init\n");
        return;
    }
    unsigned m = 0;
    nvmlDeviceGetCount_v2(&m);
    printf("nvml.count=%u\n", m);
    for (unsigned i = 0; i < m; i++) {
        nvmlDevice_t h;
        char uuid[96] = {0};
        nvmlMemory_t mem;
        nvmlMemory_v2_t m2;
        if (nvmlDeviceGetHandleByIndex_v2(i, &h) != NVML_SUCCESS)
            continue;
        nvmlDeviceGetUUID(h, uuid, sizeof uuid);
        nvmlDeviceGetMemoryInfo(h, &mem);
        m2.version = nvmlMemory_v2;
        nvmlReturn_t r2 = nvmlDeviceGetMemoryInfo_v2(h, &m2);
        printf("nvml.%u.uuid=%s\nnvml.%u.total=%llu\nnvml.%u.used=%llu\nnvml.%u.v2_total=%llu\nnvml.%u.v2_rc=%d\n", i, uuid, i,
               mem.total, i, mem.used, i, m2.total, i, (int)r2);
    }
    nvmlShutdown();
}

int main(int argc, char **argv) {
    g_prog = "limits";
    if (argc < 2) {
        fprintf(stderr, "usage: limits routes|fill|grab|fork|view [ARG]\n");
        return 2;
    }
    size_t arg = argc > 2 ? strtoull(argv[2], NULL, 0) : 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_cuda = dlopen("libcuda.so.1", RTLD_NOW);
    *(void **)&pGetProc = dlsym(g_cuda, "cuGetProcAddress_v2");
    if (getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "libvgpu"))
        CHECK(is_ours((void *)pGetProc), "dlsym(cuGetProcAddress_v2) is the hook (%s)", obj_of((void *)pGetProc));
    if (!strcmp(argv[1], "nvml")) {
        /* NVML only, as nvidia-smi or a monitor: no CUDA call at all. */
        nvml_view();
        if (arg) {
            printf("holding=1\n");
            char c;
            while (read(0, &c, 1) > 0) {
            }
        }
        return finish();
    }
    if (!OK_CU(cuInit, 0))
        return finish();
    if (!strcmp(argv[1], "view")) {
        view();
        return finish();
    }
    CUdevice dev;
    CUcontext ctx;
    OK_CU(cuDeviceGet, &dev, 0);
    OK_CU(cuDevicePrimaryCtxRetain, &ctx, dev);
    OK_CU(cuCtxSetCurrent, ctx);
    if (!strcmp(argv[1], "routes"))
        routes(arg, dev);
    else if (!strcmp(argv[1], "fill"))
        fill(arg);
    else if (!strcmp(argv[1], "grab"))
        grab(arg, argc > 3 ? argv[3] : "");
    else if (!strcmp(argv[1], "twodev"))
        twodev(arg);
    else if (!strcmp(argv[1], "threads"))
        threads(arg);
    else if (!strcmp(argv[1], "fork"))
        forked(arg);
    else if (!strcmp(argv[1], "poolsync"))
        poolsync(arg, argc > 3 ? argv[3] : "");
    else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    return finish();
}
