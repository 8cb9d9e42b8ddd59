/* cuda_api: every CUDA driver entry of issue 2, through NVIDIA's cuda.h.
 *
 * Calls the exported (versioned) names explicitly, as a binary built with
 * the header's macros would, and checks results and their effects: memory
 * accounting through cuMemGetInfo_v2, context state, pool attributes,
 * error paths. Optional expectations from the harness:
 *   CONF_EXPECT_DEVICES, CONF_EXPECT_TOTAL_MEM, CONF_EXPECT_SM_COUNT.
 * Prints PASS/FAIL lines; exits 1 if anything failed.
 */
#define _GNU_SOURCE
#define CHECK_CUDA 1
#include "check.h"
#include "sim_kernel.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

/* Old ABIs the header only declares for the driver's own build: bound to
 * the driver's unversioned exports by asm label. */
extern CUresult conf_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) __asm__("cuDeviceGetUuid");
extern CUresult conf_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags) __asm__("cuGetProcAddress");

WEAK(cuInit);
WEAK(cuDriverGetVersion);
WEAK(cuGetProcAddress_v2);
WEAK(conf_cuGetProcAddress);
WEAK(cuGetErrorName);
WEAK(cuGetErrorString);
WEAK(cuDeviceGet);
WEAK(cuDeviceGetCount);
WEAK(cuDeviceGetName);
WEAK(conf_cuDeviceGetUuid);
WEAK(cuDeviceGetUuid_v2);
WEAK(cuDeviceTotalMem_v2);
WEAK(cuDeviceGetAttribute);
WEAK(cuCtxCreate_v4);
WEAK(cuCtxDestroy_v2);
WEAK(cuCtxSetCurrent);
WEAK(cuCtxGetCurrent);
WEAK(cuCtxGetDevice);
WEAK(cuCtxSynchronize);
WEAK(cuDevicePrimaryCtxRetain);
WEAK(cuDevicePrimaryCtxRelease_v2);
WEAK(cuDevicePrimaryCtxGetState);
WEAK(cuMemAlloc_v2);
WEAK(cuMemFree_v2);
WEAK(cuMemAllocPitch_v2);
WEAK(cuMemAllocManaged);
WEAK(cuMemAllocHost_v2);
WEAK(cuMemFreeHost);
WEAK(cuMemHostAlloc);
WEAK(cuMemHostRegister_v2);
WEAK(cuMemHostUnregister);
WEAK(cuMemGetInfo_v2);
WEAK(cuMemAllocAsync);
WEAK(cuMemAllocFromPoolAsync);
WEAK(cuMemFreeAsync);
WEAK(cuDeviceGetDefaultMemPool);
WEAK(cuMemPoolGetAttribute);
WEAK(cuMemCreate);
WEAK(cuMemRelease);
WEAK(cuMemGetAllocationGranularity);
WEAK(cuMemAddressReserve);
WEAK(cuMemAddressFree);
WEAK(cuMemMap);
WEAK(cuMemUnmap);
WEAK(cuMemSetAccess);
WEAK(cuArrayCreate_v2);
WEAK(cuArray3DCreate_v2);
WEAK(cuArrayDestroy);
WEAK(cuMipmappedArrayCreate);
WEAK(cuMipmappedArrayDestroy);
WEAK(cuStreamCreate);
WEAK(cuStreamSynchronize);
WEAK(cuStreamDestroy_v2);
WEAK(cuEventCreate);
WEAK(cuEventRecord);
WEAK(cuEventSynchronize);
WEAK(cuEventElapsedTime);
WEAK(cuEventDestroy_v2);
WEAK(cuModuleLoadData);
WEAK(cuModuleGetFunction);
WEAK(cuModuleUnload);
WEAK(cuLaunchKernel);
WEAK(cuLaunchKernelEx);
WEAK(cuLaunchCooperativeKernel);
WEAK(cuGraphCreate);
WEAK(cuGraphAddKernelNode_v2);
WEAK(cuGraphInstantiateWithFlags);
WEAK(cuGraphLaunch);
WEAK(cuGraphExecDestroy);
WEAK(cuGraphDestroy);
/* Beyond issue 2's list: what async programs and pool users also call. */
WEAK(cuCtxPushCurrent_v2);
WEAK(cuCtxPopCurrent_v2);
WEAK(cuDeviceGetPCIBusId);
WEAK(cuStreamCreateWithPriority);
WEAK(cuStreamWaitEvent);
WEAK(cuStreamQuery);
WEAK(cuEventQuery);
WEAK(cuMemPoolCreate);
WEAK(cuMemPoolDestroy);
WEAK(cuMemPoolTrimTo);
WEAK(cuMemPoolSetAttribute);
WEAK(cuMemPoolSetAccess);
WEAK(cuMemPoolGetAccess);
WEAK(cuDeviceGetMemPool);
WEAK(cuDeviceSetMemPool);

#define MiB (1024ull * 1024ull)

static size_t free_mem(void) {
    size_t f = 0, t = 0;
    if (CU(cuMemGetInfo_v2, &f, &t) != CUDA_SUCCESS)
        return 0;
    return f;
}

/* The device-memory drop `op` caused, checked to be at least `want`. */
static void check_drop(const char *what, size_t before, size_t after, size_t want) {
    CHECK(before >= after && before - after >= want,
          "%s: cuMemGetInfo_v2 free dropped by %zu (>= %zu)", what,
          before >= after ? before - after : 0, want);
}

static void check_back(const char *what, size_t before, size_t after) {
    CHECK(after == before, "%s: cuMemGetInfo_v2 free back to %zu (now %zu)", what, before, after);
}

static void test_before_init(void) {
    int n = -1;
    CHECK_CU(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount, &n);
    int v = 0;
    /* cuDriverGetVersion works without cuInit (documented). */
    if (OK_CU(cuDriverGetVersion, &v))
        CHECK(v >= 12000 && v % 10 == 0, "cuDriverGetVersion before cuInit = %d", v);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuDriverGetVersion, NULL);
}

static void test_errors(void) {
    const char *s = NULL;
    if (OK_CU(cuGetErrorName, CUDA_ERROR_OUT_OF_MEMORY, &s))
        CHECK(s && strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0, "cuGetErrorName(2) = %s",
              s ? s : "(null)");
    if (OK_CU(cuGetErrorName, CUDA_SUCCESS, &s))
        CHECK(s && strcmp(s, "CUDA_SUCCESS") == 0, "cuGetErrorName(0) = %s", s ? s : "(null)");
    s = NULL;
    if (OK_CU(cuGetErrorString, CUDA_ERROR_INVALID_VALUE, &s))
        CHECK(s && *s, "cuGetErrorString(1) = \"%s\"", s ? s : "(null)");
    s = "sentinel";
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuGetErrorName, (CUresult)123456, &s);
    CHECK(s == NULL, "cuGetErrorName(unknown) sets *pStr = NULL");
    s = "sentinel";
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuGetErrorString, (CUresult)123456, &s);
    CHECK(s == NULL, "cuGetErrorString(unknown) sets *pStr = NULL");
}

static int attr(CUdevice_attribute a, CUdevice d) {
    int v = -1;
    CU(cuDeviceGetAttribute, &v, a, d);
    return v;
}

static int test_devices(void) {
    int n = 0;
    unsigned long long want;
    if (!OK_CU(cuDeviceGetCount, &n))
        return 0;
    CHECK(n >= 1, "cuDeviceGetCount = %d", n);
    if (expect_env("CONF_EXPECT_DEVICES", &want))
        CHECK((unsigned long long)n == want, "device count %d == %llu", n, want);
    CUdevice d = -1;
    CHECK_CU(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet, &d, n);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuDeviceGet, NULL, 0);
    CUuuid first = {{0}};
    for (int i = 0; i < n; i++) {
        printf("# device %d\n", i);
        if (!OK_CU(cuDeviceGet, &d, i))
            continue;
        CHECK(d == i, "cuDeviceGet(%d) = %d", i, d);
        char name[256] = {0};
        if (OK_CU(cuDeviceGetName, name, sizeof name, d))
            CHECK(name[0] != 0 && strlen(name) < sizeof name, "cuDeviceGetName = \"%s\"", name);
        char small[4];
        memset(small, 'x', sizeof small);
        if (OK_CU(cuDeviceGetName, small, sizeof small, d))
            CHECK(memchr(small, 0, sizeof small) != NULL, "cuDeviceGetName truncates and terminates");
        CUuuid u1, u2;
        memset(&u1, 0, sizeof u1);
        memset(&u2, 0xff, sizeof u2);
        int g1 = OK_CU(conf_cuDeviceGetUuid, &u1, d);
        int g2 = OK_CU(cuDeviceGetUuid_v2, &u2, d);
        if (g1 && g2)
            CHECK(memcmp(&u1, &u2, sizeof u1) == 0, "cuDeviceGetUuid and _v2 agree");
        static const CUuuid zero;
        if (g2) {
            CHECK(memcmp(&u2, &zero, sizeof zero) != 0, "device %d UUID is not all zero", i);
            if (i == 0)
                first = u2;
            else
                CHECK(memcmp(&u2, &first, sizeof first) != 0, "device %d UUID differs from device 0", i);
        }
        size_t total = 0;
        if (OK_CU(cuDeviceTotalMem_v2, &total, d)) {
            CHECK(total > 0, "cuDeviceTotalMem_v2 = %zu", total);
            if (expect_env("CONF_EXPECT_TOTAL_MEM", &want))
                CHECK(total == want, "total memory %zu == %llu", total, want);
        }
        int sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
        OK_CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
        CHECK(sms > 0, "SM count = %d", sms);
        if (expect_env("CONF_EXPECT_SM_COUNT", &want))
            CHECK((unsigned long long)sms == want, "SM count %d == %llu", sms, want);
        int tps = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, d);
        CHECK(tps >= 1024 && tps % 32 == 0, "max threads per SM = %d", tps);
        int ccmaj = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
        int ccmin = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
        CHECK(ccmaj >= 5 && ccmin >= 0 && ccmin < 10, "compute capability = %d.%d", ccmaj, ccmin);
        int bus = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d);
        int dev = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d);
        int dom = attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d);
        CHECK(bus >= 0 && bus < 256 && dev >= 0 && dev < 32 && dom >= 0,
              "PCI domain:bus:device = %04x:%02x:%02x", dom, bus, dev);
        int v = 7;
        CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute, &v, (CUdevice_attribute)100000, d);
    }
    return n;
}

static void test_contexts(CUdevice dev) {
    CUcontext c = NULL, cur = (CUcontext)1;
    /* No context yet on this thread. */
    if (OK_CU(cuCtxGetCurrent, &cur))
        CHECK(cur == NULL, "no current context before any is made");
    if (OK_CU(conf_cuCtxCreate_v2, &c, 0, dev)) {
        CHECK(c != NULL, "cuCtxCreate_v2 gives a context");
        if (OK_CU(cuCtxGetCurrent, &cur))
            CHECK(cur == c, "cuCtxCreate_v2 makes it current");
        CUdevice got = -1;
        if (OK_CU(cuCtxGetDevice, &got))
            CHECK(got == dev, "cuCtxGetDevice = %d", got);
        OK_CU(cuCtxSynchronize);
        OK_CU(cuCtxSetCurrent, NULL);
        if (OK_CU(cuCtxGetCurrent, &cur))
            CHECK(cur == NULL, "cuCtxSetCurrent(NULL) clears it");
        CUdevice dummy;
        CHECK_CU(CUDA_ERROR_INVALID_CONTEXT, cuCtxGetDevice, &dummy);
        OK_CU(cuCtxSetCurrent, c);
        if (OK_CU(cuCtxGetCurrent, &cur))
            CHECK(cur == c, "cuCtxSetCurrent(ctx) makes it current");
        OK_CU(cuCtxDestroy_v2, c);
        if (OK_CU(cuCtxGetCurrent, &cur))
            CHECK(cur != c, "destroyed context is no longer current");
    }
    CUcontext c3 = NULL;
    if (OK_CU(conf_cuCtxCreate_v3, &c3, NULL, 0, 0, dev)) {
        CHECK(c3 != NULL, "cuCtxCreate_v3 gives a context");
        OK_CU(cuCtxDestroy_v2, c3);
    }
    CUcontext c4 = NULL;
    CUctxCreateParams params;
    memset(&params, 0, sizeof params);
    if (OK_CU(cuCtxCreate_v4, &c4, &params, 0, dev)) {
        CHECK(c4 != NULL, "cuCtxCreate_v4 gives a context");
        CUdevice got = -1;
        if (OK_CU(cuCtxGetDevice, &got))
            CHECK(got == dev, "cuCtxGetDevice after _v4 = %d", got);
        OK_CU(cuCtxDestroy_v2, c4);
    }
    CUcontext bad = NULL;
    CHECK_CU(CUDA_ERROR_INVALID_DEVICE, conf_cuCtxCreate_v2, &bad, 0, 9999);
    OK_CU(cuCtxSetCurrent, NULL);
}

static void test_primary(CUdevice dev) {
    unsigned flags = 99;
    int active = -1;
    if (OK_CU(cuDevicePrimaryCtxGetState, dev, &flags, &active))
        CHECK(active == 0, "primary context inactive before retain (active=%d)", active);
    CUcontext p1 = NULL, p2 = NULL;
    if (!OK_CU(cuDevicePrimaryCtxRetain, &p1, dev))
        return;
    CHECK(p1 != NULL, "cuDevicePrimaryCtxRetain gives a context");
    if (OK_CU(cuDevicePrimaryCtxRetain, &p2, dev))
        CHECK(p2 == p1, "nested retain gives the same primary context");
    if (OK_CU(cuDevicePrimaryCtxGetState, dev, &flags, &active))
        CHECK(active == 1, "primary context active after retain (active=%d)", active);
    OK_CU(cuDevicePrimaryCtxRelease_v2, dev);
    if (OK_CU(cuDevicePrimaryCtxGetState, dev, &flags, &active))
        CHECK(active == 1, "still active after one of two releases (active=%d)", active);
    OK_CU(cuDevicePrimaryCtxRelease_v2, dev);
    if (OK_CU(cuDevicePrimaryCtxGetState, dev, &flags, &active))
        CHECK(active == 0, "inactive after the last release (active=%d)", active);
}

static void test_memory(CUdevice dev) {
    size_t f0 = 0, t0 = 0;
    if (OK_CU(cuMemGetInfo_v2, &f0, &t0))
        CHECK(t0 > 0 && f0 <= t0, "cuMemGetInfo_v2 free %zu <= total %zu", f0, t0);
    size_t total = 0;
    CU(cuDeviceTotalMem_v2, &total, dev);
    CHECK(t0 == total, "cuMemGetInfo_v2 total %zu == cuDeviceTotalMem_v2 %zu", t0, total);

    CUdeviceptr p = 0;
    size_t before = free_mem();
    if (OK_CU(cuMemAlloc_v2, &p, 64 * MiB)) {
        CHECK(p != 0, "cuMemAlloc_v2 gives a non-null pointer");
        check_drop("cuMemAlloc_v2 64 MiB", before, free_mem(), 64 * MiB);
        OK_CU(cuMemFree_v2, p);
        check_back("cuMemFree_v2", before, free_mem());
    }
    CHECK_CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2, &p, t0 + 1);
    check_back("failed cuMemAlloc_v2 leaves memory alone", before, free_mem());
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuMemAlloc_v2, &p, 0);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2, (CUdeviceptr)0x12345);

    size_t pitch = 0;
    if (OK_CU(cuMemAllocPitch_v2, &p, &pitch, 1000, 1000, 4)) {
        CHECK(pitch >= 1000 && pitch % 4 == 0, "cuMemAllocPitch_v2 pitch = %zu", pitch);
        check_drop("cuMemAllocPitch_v2", before, free_mem(), pitch * 1000);
        OK_CU(cuMemFree_v2, p);
        check_back("cuMemFree_v2 (pitched)", before, free_mem());
    }
    if (OK_CU(cuMemAllocManaged, &p, 32 * MiB, CU_MEM_ATTACH_GLOBAL)) {
        CHECK(p != 0, "cuMemAllocManaged gives a pointer");
        check_drop("cuMemAllocManaged", before, free_mem(), 32 * MiB);
        OK_CU(cuMemFree_v2, p);
        check_back("cuMemFree_v2 (managed)", before, free_mem());
    }

    /* Host memory: usable by the CPU, never charged to the device. */
    void *h = NULL;
    if (OK_CU(cuMemAllocHost_v2, &h, 1 * MiB)) {
        CHECK(h != NULL, "cuMemAllocHost_v2 gives a pointer");
        if (h) {
            memset(h, 0xab, 1 * MiB);
            CHECK(((unsigned char *)h)[MiB - 1] == 0xab, "host allocation is writable");
        }
        check_back("cuMemAllocHost_v2 costs no device memory", before, free_mem());
        OK_CU(cuMemFreeHost, h);
    }
    h = NULL;
    if (OK_CU(cuMemHostAlloc, &h, 1 * MiB, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)) {
        CHECK(h != NULL, "cuMemHostAlloc gives a pointer");
        if (h)
            memset(h, 1, 1 * MiB);
        OK_CU(cuMemFreeHost, h);
    }
    void *buf = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (OK_CU(cuMemHostRegister_v2, buf, 2 * MiB, 0)) {
        CHECK_CU(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister_v2, buf, 2 * MiB, 0);
        OK_CU(cuMemHostUnregister, buf);
    }
    CHECK_CU(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister, buf);
    munmap(buf, 2 * MiB);
}

static unsigned long long pool_attr(CUmemoryPool pool, CUmemPool_attribute a) {
    cuuint64_t v = ~0ull;
    CU(cuMemPoolGetAttribute, pool, a, &v);
    return v;
}

static void test_async(CUdevice dev) {
    CUstream s = NULL;
    if (!OK_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING))
        return;
    CUmemoryPool pool = NULL;
    if (OK_CU(cuDeviceGetDefaultMemPool, &pool, dev))
        CHECK(pool != NULL, "cuDeviceGetDefaultMemPool gives a pool");
    size_t before = free_mem();
    CUdeviceptr a = 0, b = 0;
    int ga = OK_CU(cuMemAllocAsync, &a, 16 * MiB, s);
    int gb = pool ? OK_CU(cuMemAllocFromPoolAsync, &b, 8 * MiB, pool, s) : 0;
    OK_CU(cuStreamSynchronize, s);
    if (ga && gb) {
        CHECK(a != b && a && b, "async allocations are distinct");
        check_drop("cuMemAllocAsync + cuMemAllocFromPoolAsync", before, free_mem(), 24 * MiB);
    }
    if (pool) {
        unsigned long long used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
        unsigned long long res = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        unsigned long long usedh = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
        unsigned long long resh = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
        cuuint64_t v;
        OK_CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v);
        CHECK(used >= 24 * MiB && used != ~0ull, "pool used current = %llu (>= 24 MiB)", used);
        CHECK(res >= used && res != ~0ull, "pool reserved current %llu >= used %llu", res, used);
        CHECK(usedh >= used && usedh != ~0ull, "pool used high %llu >= used %llu", usedh, used);
        CHECK(resh >= res && resh != ~0ull, "pool reserved high %llu >= reserved %llu", resh, res);
    }
    if (ga)
        OK_CU(cuMemFreeAsync, a, s);
    if (gb)
        OK_CU(cuMemFreeAsync, b, s);
    OK_CU(cuStreamSynchronize, s);
    if (pool) {
        unsigned long long used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
        unsigned long long usedh = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
        CHECK(used == 0, "pool used current back to 0 after frees (%llu)", used);
        CHECK(usedh >= 24 * MiB && usedh != ~0ull, "pool used high keeps its mark (%llu)", usedh);
        /* Release threshold 0 (the default): the synchronize gave it all back. */
        unsigned long long res = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        CHECK(res == 0, "default pool (threshold 0) holds nothing after the frees and a synchronize (%llu)", res);
        check_back("default pool after the frees and a synchronize", before, free_mem());
    }
    OK_CU(cuStreamDestroy_v2, s);
}

static void test_vmm(CUdevice dev) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    if (!OK_CU(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        return;
    CHECK(gran > 0 && (gran & (gran - 1)) == 0, "granularity = %zu (a power of two)", gran);
    size_t size = 4 * gran;
    size_t before = free_mem();
    CUmemGenericAllocationHandle hnd = 0;
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuMemCreate, &hnd, gran + 1, &prop, 0);
    if (!OK_CU(cuMemCreate, &hnd, size, &prop, 0))
        return;
    check_drop("cuMemCreate", before, free_mem(), size);
    CUdeviceptr va = 0;
    if (OK_CU(cuMemAddressReserve, &va, size, 0, 0, 0)) {
        CHECK(va != 0 && va % gran == 0, "cuMemAddressReserve gives an aligned range");
        if (OK_CU(cuMemMap, va, size, 0, hnd, 0)) {
            CUmemAccessDesc acc;
            memset(&acc, 0, sizeof acc);
            acc.location = prop.location;
            acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            OK_CU(cuMemSetAccess, va, size, &acc, 1);
            OK_CU(cuMemUnmap, va, size);
        }
        OK_CU(cuMemAddressFree, va, size);
    }
    OK_CU(cuMemRelease, hnd);
    check_back("cuMemRelease", before, free_mem());
}

static void test_arrays(void) {
    size_t before = free_mem();
    CUarray arr = NULL;
    CUDA_ARRAY_DESCRIPTOR d;
    memset(&d, 0, sizeof d);
    d.Width = 1024;
    d.Height = 1024;
    d.Format = CU_AD_FORMAT_FLOAT;
    d.NumChannels = 4;
    if (OK_CU(cuArrayCreate_v2, &arr, &d)) {
        check_drop("cuArrayCreate_v2 1024x1024 float4", before, free_mem(), 1024 * 1024 * 16);
        OK_CU(cuArrayDestroy, arr);
        check_back("cuArrayDestroy", before, free_mem());
    }
    CUDA_ARRAY3D_DESCRIPTOR d3;
    memset(&d3, 0, sizeof d3);
    d3.Width = 256;
    d3.Height = 256;
    d3.Depth = 64;
    d3.Format = CU_AD_FORMAT_UNSIGNED_INT16;
    d3.NumChannels = 2;
    arr = NULL;
    if (OK_CU(cuArray3DCreate_v2, &arr, &d3)) {
        check_drop("cuArray3DCreate_v2 256x256x64 u16x2", before, free_mem(), 256 * 256 * 64 * 4);
        OK_CU(cuArrayDestroy, arr);
        check_back("cuArrayDestroy (3D)", before, free_mem());
    }
    CUmipmappedArray mm = NULL;
    d3.Depth = 0;
    d3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    d3.NumChannels = 4;
    if (OK_CU(cuMipmappedArrayCreate, &mm, &d3, 4)) {
        /* Level 0 alone is 256 KiB; the chain is at least that. */
        check_drop("cuMipmappedArrayCreate 256x256 u8x4, 4 levels", before, free_mem(), 256 * 256 * 4);
        OK_CU(cuMipmappedArrayDestroy, mm);
        check_back("cuMipmappedArrayDestroy", before, free_mem());
    }
    d.Format = (CUarray_format)0x7777;
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuArrayCreate_v2, &arr, &d);
}

static void test_launch(void) {
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    /* A real driver takes unknown text for PTX and may say INVALID_PTX. */
    CUresult bad = CU(cuModuleLoadData, &mod, "definitely not a module");
    CHECK(bad == CUDA_ERROR_INVALID_IMAGE || bad == CUDA_ERROR_INVALID_PTX,
          "cuModuleLoadData(garbage) -> %s (%u): INVALID_IMAGE or INVALID_PTX", cu_name(bad),
          (unsigned)bad);
    if (!OK_CU(cuModuleLoadData, &mod, sim_module_image()))
        return;
    CHECK_CU(CUDA_ERROR_NOT_FOUND, cuModuleGetFunction, &fn, mod, "no_such_kernel");
    if (!OK_CU(cuModuleGetFunction, &fn, mod, sim_kernel_name()))
        return;
    CHECK(fn != NULL, "cuModuleGetFunction gives a function");
    CUstream s = NULL;
    OK_CU(cuStreamCreate, &s, 0);
    CUevent e0 = NULL, e1 = NULL;
    OK_CU(cuEventCreate, &e0, CU_EVENT_DEFAULT);
    OK_CU(cuEventCreate, &e1, CU_EVENT_DEFAULT);
    uint64_t block_ns = 100000; /* 0.1 ms per block */
    void *args[] = {&block_ns};
    OK_CU(cuEventRecord, e0, s);
    OK_CU(cuLaunchKernel, fn, 16, 1, 1, 128, 1, 1, 0, s, args, NULL);
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = 8;
    cfg.gridDimY = 2;
    cfg.gridDimZ = 1;
    cfg.blockDimX = 256;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    cfg.hStream = s;
    OK_CU(cuLaunchKernelEx, &cfg, fn, args, NULL);
    OK_CU(cuLaunchCooperativeKernel, fn, 4, 1, 1, 64, 1, 1, 0, s, args);
    OK_CU(cuEventRecord, e1, s);
    OK_CU(cuEventSynchronize, e1);
    float ms = -1;
    if (OK_CU(cuEventElapsedTime, &ms, e0, e1))
        CHECK(ms >= 0, "cuEventElapsedTime = %.3f ms", ms);
    OK_CU(cuStreamSynchronize, s);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel, fn, 0, 1, 1, 1, 1, 1, 0, s, args, NULL);

    /* The sim's kernel model: at most SM-count blocks per wave, kernels of
     * one stream in order. One wave, then two waves, of 1 ms blocks take at
     * least 3 ms of device time. (A lower bound only: a busy host can only
     * add time. Sim only: a real GPU runs many blocks per SM at once.) */
    if (getenv("VGPU_SIM_DIR")) {
        int sms = 0;
        CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
        uint64_t one_ms = 1000000;
        void *a1[] = {&one_ms};
        OK_CU(cuEventRecord, e0, s);
        OK_CU(cuLaunchKernel, fn, (unsigned)sms, 1, 1, 128, 1, 1, 0, s, a1, NULL);
        OK_CU(cuLaunchKernel, fn, (unsigned)sms + 1, 1, 1, 128, 1, 1, 0, s, a1, NULL);
        OK_CU(cuEventRecord, e1, s);
        OK_CU(cuEventSynchronize, e1);
        ms = -1;
        if (OK_CU(cuEventElapsedTime, &ms, e0, e1))
            CHECK(ms >= 2.999f, "%d + %d blocks of 1 ms in one stream: %.3f ms >= 3 waves", sms,
                  sms + 1, ms);
    }

    CUgraph g = NULL;
    if (OK_CU(cuGraphCreate, &g, 0)) {
        CUDA_KERNEL_NODE_PARAMS np;
        memset(&np, 0, sizeof np);
        np.func = fn;
        np.gridDimX = 4;
        np.gridDimY = 1;
        np.gridDimZ = 1;
        np.blockDimX = 32;
        np.blockDimY = 1;
        np.blockDimZ = 1;
        np.kernelParams = args;
        CUgraphNode node = NULL;
        if (OK_CU(cuGraphAddKernelNode_v2, &node, g, NULL, 0, &np))
            CHECK(node != NULL, "cuGraphAddKernelNode_v2 gives a node");
        CUgraphExec ex = NULL;
        if (OK_CU(cuGraphInstantiateWithFlags, &ex, g, 0)) {
            OK_CU(cuGraphLaunch, ex, s);
            OK_CU(cuStreamSynchronize, s);
            OK_CU(cuGraphExecDestroy, ex);
        }
        OK_CU(cuGraphDestroy, g);
    }
    OK_CU(cuEventDestroy_v2, e0);
    OK_CU(cuEventDestroy_v2, e1);
    OK_CU(cuStreamDestroy_v2, s);
    OK_CU(cuModuleUnload, mod);
}

static void test_getprocaddress(void) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = -1;
    if (OK_CU(cuGetProcAddress_v2, "cuMemAlloc", &p, 12090, 0, &st))
        CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && p == (void *)&cuMemAlloc_v2,
              "cuGetProcAddress_v2(cuMemAlloc, 12090) = cuMemAlloc_v2");
    p = (void *)1;
    CHECK_CU(CUDA_ERROR_NOT_FOUND, cuGetProcAddress_v2, "cuNoSuchFunction", &p, 12090, 0, &st);
    CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && p == NULL,
          "unknown symbol: SYMBOL_NOT_FOUND and NULL");
    /* cuMemAllocAsync exists only from 11.2: asking at 11.0 is too old. */
    p = (void *)1;
    CHECK_CU(CUDA_ERROR_NOT_FOUND, cuGetProcAddress_v2, "cuMemAllocAsync", &p, 11000, 0, &st);
    CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && p == NULL,
          "cuMemAllocAsync at 11000: VERSION_NOT_SUFFICIENT and NULL (status %d)", (int)st);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress_v2, NULL, &p, 12090, 0, &st);
    p = NULL;
    if (OK_CU(conf_cuGetProcAddress, "cuCtxCreate", &p, 3020, 0))
        CHECK(p == (void *)&conf_cuCtxCreate_v2, "cuGetProcAddress(cuCtxCreate, 3020) = cuCtxCreate_v2");

    /* The stream flags pick the legacy or the per-thread-stream entry (the
     * latter where the driver has one; what a call by that name reaches,
     * an interposer's hook included). */
    if (OK_CU(cuGetProcAddress_v2, "cuLaunchKernel", &p, 12090, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
              &st))
        CHECK(p == (void *)&cuLaunchKernel, "cuLaunchKernel with LEGACY_STREAM = cuLaunchKernel");
    if (OK_CU(cuGetProcAddress_v2, "cuLaunchKernel", &p, 12090, CU_GET_PROC_ADDRESS_DEFAULT, &st))
        CHECK(p == (void *)&cuLaunchKernel, "cuLaunchKernel with DEFAULT = cuLaunchKernel");
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    void *ptsz = drv ? dlsym(drv, "cuLaunchKernel_ptsz") : NULL;
    if (ptsz &&
        OK_CU(cuGetProcAddress_v2, "cuLaunchKernel", &p, 12090,
              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st))
        CHECK(p == dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz"),
              "cuLaunchKernel with PER_THREAD_DEFAULT_STREAM = cuLaunchKernel_ptsz");
}


/* ---- beyond issue 2's list -------------------------------------------- */

static void test_ctx_stack(CUdevice dev, CUcontext outer) {
    CUcontext c = NULL, cur = NULL, popped = NULL;
    if (!OK_CU(conf_cuCtxCreate_v2, &c, 0, dev))
        return;
    /* cuCtxCreate pushed c on top of outer; pop it, push it back. */
    if (OK_CU(cuCtxPopCurrent_v2, &popped))
        CHECK(popped == c, "cuCtxPopCurrent_v2 returns the context just made");
    if (OK_CU(cuCtxGetCurrent, &cur))
        CHECK(cur == outer, "after the pop the outer context is current again");
    OK_CU(cuCtxPushCurrent_v2, c);
    if (OK_CU(cuCtxGetCurrent, &cur))
        CHECK(cur == c, "cuCtxPushCurrent_v2 makes it current");
    OK_CU(cuCtxDestroy_v2, c);
    if (OK_CU(cuCtxGetCurrent, &cur))
        CHECK(cur == outer, "destroying the top context pops it");
}

static void test_pci_bus_id(CUdevice dev) {
    char id[32] = "", want[32];
    int bus = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
    int slot = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev);
    int dom = attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev);
    snprintf(want, sizeof want, "%04x:%02x:%02x.0", dom, bus, slot);
    if (OK_CU(cuDeviceGetPCIBusId, id, sizeof id, dev))
        CHECK(strcasecmp(id, want) == 0, "cuDeviceGetPCIBusId \"%s\" == attributes \"%s\"", id,
              want);
}

static void test_stream_order(void) {
    CUmodule mod;
    CUfunction fn;
    CUstream a = NULL, b = NULL;
    CUevent start, mid, end;
    if (CU(cuModuleLoadData, &mod, sim_module_image()) ||
        CU(cuModuleGetFunction, &fn, mod, sim_kernel_name()))
        return;
    int lo = 0;
    OK_CU(cuStreamCreateWithPriority, &a, CU_STREAM_NON_BLOCKING, lo);
    OK_CU(cuStreamCreate, &b, CU_STREAM_NON_BLOCKING);
    OK_CU(cuEventCreate, &start, CU_EVENT_DEFAULT);
    OK_CU(cuEventCreate, &mid, CU_EVENT_DEFAULT);
    OK_CU(cuEventCreate, &end, CU_EVENT_DEFAULT);
    uint64_t ns = 2000000; /* 2 ms per block, one wave each */
    void *args[] = {&ns};
    OK_CU(cuEventRecord, start, a);
    OK_CU(cuLaunchKernel, fn, 1, 1, 1, 32, 1, 1, 0, a, args, NULL);
    OK_CU(cuEventRecord, mid, a);
    /* b waits for a's kernel, then runs its own. */
    OK_CU(cuStreamWaitEvent, b, mid, 0);
    OK_CU(cuLaunchKernel, fn, 1, 1, 1, 32, 1, 1, 0, b, args, NULL);
    OK_CU(cuEventRecord, end, b);
    OK_CU(cuStreamSynchronize, b);
    CHECK_CU(CUDA_SUCCESS, cuEventQuery, mid);
    CHECK_CU(CUDA_SUCCESS, cuStreamQuery, a);
    float ms = -1;
    if (OK_CU(cuEventElapsedTime, &ms, start, end))
        CHECK(ms >= 3.999f, "kernel on b after cuStreamWaitEvent on a's: %.3f ms >= 2 + 2 ms", ms);
    OK_CU(cuEventDestroy_v2, start);
    OK_CU(cuEventDestroy_v2, mid);
    OK_CU(cuEventDestroy_v2, end);
    OK_CU(cuStreamDestroy_v2, a);
    OK_CU(cuStreamDestroy_v2, b);
    OK_CU(cuModuleUnload, mod);
}

static void test_own_pool(CUdevice dev) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    CUmemoryPool pool = NULL, dflt = NULL, cur = NULL;
    if (!OK_CU(cuMemPoolCreate, &pool, &props))
        return;
    cuuint64_t thr = ~0ull, got = 0;
    OK_CU(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
    if (OK_CU(cuMemPoolGetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &got))
        CHECK(got == thr, "release threshold set to %llu reads %llu", (unsigned long long)thr,
              (unsigned long long)got);
    CUstream s = NULL;
    OK_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
    size_t before = free_mem();
    CUdeviceptr p = 0;
    if (OK_CU(cuMemAllocFromPoolAsync, &p, 8 * MiB, pool, s)) {
        OK_CU(cuStreamSynchronize, s);
        check_drop("cuMemAllocFromPoolAsync on an own pool", before, free_mem(), 8 * MiB);
        OK_CU(cuMemFreeAsync, p, s);
        OK_CU(cuStreamSynchronize, s);
        /* The threshold keeps the memory reserved until trimmed. */
        unsigned long long res = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        CHECK(res >= 8 * MiB && res != ~0ull, "freed memory stays reserved (%llu)", res);
        CHECK(before - free_mem() >= 8 * MiB, "and stays device memory (free %zu below)", before - free_mem());
        /* Reused before the pool grows. */
        if (OK_CU(cuMemAllocFromPoolAsync, &p, 8 * MiB, pool, s)) {
            unsigned long long again = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
            CHECK(again == res, "an allocation that fits the freed memory does not grow the pool (%llu, was %llu)",
                  again, res);
            OK_CU(cuMemFreeAsync, p, s);
            OK_CU(cuStreamSynchronize, s);
        }
        /* Trimming to at least what is reserved keeps it all. */
        OK_CU(cuMemPoolTrimTo, pool, (size_t)res);
        unsigned long long kept = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        CHECK(kept == res, "cuMemPoolTrimTo(reserved) keeps it (%llu, was %llu)", kept, res);
        OK_CU(cuMemPoolTrimTo, pool, 0);
        res = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        CHECK(res == 0, "cuMemPoolTrimTo(0) releases it (%llu)", res);
        check_back("trimmed pool", before, free_mem());
    }
    /* Growth past the device's memory is refused and leaves the pool as it was. */
    size_t f = 0, t = 0;
    if (OK_CU(cuMemGetInfo_v2, &f, &t)) {
        CHECK_CU(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocFromPoolAsync, &p, t + 2 * MiB, pool, s);
        unsigned long long res = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        CHECK(res == 0, "a refused growth reserves nothing (%llu)", res);
    }
    /* Access: the owning device reads and writes; another device only once
     * granted. */
    CUmemAccess_flags acc = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CUmemLocation here = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    if (OK_CU(cuMemPoolGetAccess, &acc, pool, &here))
        CHECK(acc == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "the owning device reads and writes its pool (%d)", (int)acc);
    int ndev = 0;
    cuDeviceGetCount(&ndev);
    if (ndev > 1) {
        CUmemLocation other = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev == 0 ? 1 : 0};
        if (OK_CU(cuMemPoolGetAccess, &acc, pool, &other))
            CHECK(acc == CU_MEM_ACCESS_FLAGS_PROT_NONE, "another device has no access by default (%d)", (int)acc);
        CUmemAccessDesc ad = {.location = other, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (OK_CU(cuMemPoolSetAccess, pool, &ad, 1) && OK_CU(cuMemPoolGetAccess, &acc, pool, &other))
            CHECK(acc == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "granted access reads back (%d)", (int)acc);
        ad.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
        if (OK_CU(cuMemPoolSetAccess, pool, &ad, 1) && OK_CU(cuMemPoolGetAccess, &acc, pool, &other))
            CHECK(acc == CU_MEM_ACCESS_FLAGS_PROT_NONE, "revoked access reads back (%d)", (int)acc);
    }
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuMemPoolSetAccess, pool, NULL, 1);
    /* The device's current pool can be swapped and restored. */
    if (OK_CU(cuDeviceGetDefaultMemPool, &dflt, dev) && OK_CU(cuDeviceSetMemPool, dev, pool) &&
        OK_CU(cuDeviceGetMemPool, &cur, dev)) {
        CHECK(cur == pool, "cuDeviceGetMemPool returns the pool just set");
        OK_CU(cuDeviceSetMemPool, dev, dflt);
        if (OK_CU(cuDeviceGetMemPool, &cur, dev))
            CHECK(cur == dflt, "and the default after restoring it");
    }
    OK_CU(cuMemPoolDestroy, pool);
    /* Destroyed with an allocation still out: that allocation stays usable
     * and its memory returns once it is freed (cuda.h). */
    CUmemoryPool pool2 = NULL;
    if (OK_CU(cuMemPoolCreate, &pool2, &props)) {
        before = free_mem();
        if (OK_CU(cuMemAllocFromPoolAsync, &p, 8 * MiB, pool2, s)) {
            OK_CU(cuStreamSynchronize, s);
            OK_CU(cuMemPoolDestroy, pool2);
            check_drop("allocation outliving its pool", before, free_mem(), 8 * MiB);
            OK_CU(cuMemFreeAsync, p, s);
            OK_CU(cuStreamSynchronize, s);
            check_back("last allocation of a destroyed pool freed", before, free_mem());
        } else {
            OK_CU(cuMemPoolDestroy, pool2);
        }
    }
    /* A pool in host memory (a host NUMA node): the CPU may use it, and it
     * takes no device memory. Plain HOST is not a pool location (cuda.h). */
    CUmemPoolProps hp;
    memset(&hp, 0, sizeof hp);
    hp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    hp.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemoryPool hpool = NULL;
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuMemPoolCreate, &hpool, &hp);
    hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    hp.location.id = 0;
    CUresult hr = CU(cuMemPoolCreate, &hpool, &hp);
    CHECK(hr == CUDA_SUCCESS || hr == CUDA_ERROR_NOT_SUPPORTED, "cuMemPoolCreate on host NUMA node 0 -> %d", (int)hr);
    if (hr == CUDA_SUCCESS) {
        before = free_mem();
        if (OK_CU(cuMemAllocFromPoolAsync, &p, 8 * MiB, hpool, s)) {
            OK_CU(cuStreamSynchronize, s);
            memset((void *)(uintptr_t)p, 0x5a, 8 * MiB);
            CHECK(((unsigned char *)(uintptr_t)p)[8 * MiB - 1] == 0x5a, "host pool memory is host memory");
            check_back("host pool allocation (no device memory)", before, free_mem());
            CUmemLocation cpu = {.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = 0};
            CUmemAccess_flags hacc = CU_MEM_ACCESS_FLAGS_PROT_NONE;
            if (OK_CU(cuMemPoolGetAccess, &hacc, hpool, &cpu))
                CHECK(hacc == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "the CPU reads and writes a host pool (%d)", (int)hacc);
            OK_CU(cuMemFreeAsync, p, s);
            OK_CU(cuStreamSynchronize, s);
        }
        OK_CU(cuMemPoolDestroy, hpool);
    }
    OK_CU(cuStreamDestroy_v2, s);
}

int main(void) {
    g_prog = "cuda_api";
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_before_init();
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuInit, 1);
    if (!OK_CU(cuInit, 0))
        return finish();
    OK_CU(cuInit, 0); /* idempotent */
    test_errors();
    int n = test_devices();
    if (n < 1)
        return finish();
    CUdevice dev = 0;
    test_contexts(dev);
    test_primary(dev);
    CUcontext ctx = NULL;
    if (!OK_CU(conf_cuCtxCreate_v2, &ctx, 0, dev))
        return finish();
    test_memory(dev);
    test_async(dev);
    test_vmm(dev);
    test_arrays();
    test_launch();
    test_getprocaddress();
    printf("# beyond issue 2's list\n");
    test_ctx_stack(dev, ctx);
    test_pci_bus_id(dev);
    test_stream_order();
    test_own_pool(dev);
    OK_CU(cuCtxDestroy_v2, ctx);
    return finish();
}
