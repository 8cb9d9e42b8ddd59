/* cuda_data: device memory holds bytes, through NVIDIA's cuda.h.
 *
 * Round trips through every memcpy/memset family (linear, 2D, 3D, async on
 * a stream, per-thread-default-stream exports, unified cuMemcpy), managed
 * memory the CPU reads and writes, a huge sparse allocation that costs
 * only what is touched, pointer attributes and address ranges, and IPC
 * across two processes: this program re-executes itself as the importer
 * (`cuda_data ipc-child HANDLES...`), which opens the exporter's memory
 * (not charged to it), reads and writes it, and waits on an exported
 * event. Runs unchanged on a real GPU. Prints PASS/FAIL lines.
 */
#define _GNU_SOURCE
#define CHECK_CUDA 1
#include "check.h"
#include "sim_kernel.h"

#include <dirent.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

/* Per-thread default-stream exports, declared by their ABI (the header
 * declares them only for its own per-thread build). */
#define PTDS(name, base) extern __typeof__(base) name __asm__(#name) __attribute__((weak))
PTDS(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2);
PTDS(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2);
PTDS(cuMemcpy_ptds, cuMemcpy);
PTDS(cuMemsetD32_v2_ptds, cuMemsetD32_v2);
PTDS(cuMemcpyAsync_ptsz, cuMemcpyAsync);

WEAK(cuInit);
WEAK(cuDeviceGet);
WEAK(cuDeviceGetCount);
WEAK(cuDeviceTotalMem_v2);
WEAK(cuDevicePrimaryCtxRetain);
WEAK(cuDevicePrimaryCtxRelease_v2);
WEAK(cuCtxSetCurrent);
WEAK(cuCtxGetCurrent);
WEAK(cuCtxSynchronize);
WEAK(cuMemAlloc_v2);
WEAK(cuMemAllocManaged);
WEAK(cuMemAllocPitch_v2);
WEAK(cuMemAllocHost_v2);
WEAK(cuMemFreeHost);
WEAK(cuMemFree_v2);
WEAK(cuMemGetInfo_v2);
WEAK(cuMemcpyHtoD_v2);
WEAK(cuMemcpyDtoH_v2);
WEAK(cuMemcpyDtoD_v2);
WEAK(cuMemcpyHtoDAsync_v2);
WEAK(cuMemcpyDtoHAsync_v2);
WEAK(cuMemcpyDtoDAsync_v2);
WEAK(cuMemcpy);
WEAK(cuMemcpyAsync);
WEAK(cuMemcpy2D_v2);
WEAK(cuMemcpy2DAsync_v2);
WEAK(cuMemcpy3D_v2);
WEAK(cuMemsetD8_v2);
WEAK(cuMemsetD16_v2);
WEAK(cuMemsetD32_v2);
WEAK(cuMemsetD8Async);
WEAK(cuMemsetD2D8_v2);
WEAK(cuMemsetD2D32_v2);
WEAK(cuStreamCreate);
WEAK(cuStreamSynchronize);
WEAK(cuStreamDestroy_v2);
WEAK(cuEventCreate);
WEAK(cuEventRecord);
WEAK(cuEventSynchronize);
WEAK(cuEventQuery);
WEAK(cuEventDestroy_v2);
WEAK(cuModuleLoadData);
WEAK(cuModuleGetFunction);
WEAK(cuModuleUnload);
WEAK(cuLaunchKernel);
WEAK(cuPointerGetAttribute);
WEAK(cuPointerGetAttributes);
WEAK(cuMemGetAddressRange_v2);
WEAK(cuIpcGetMemHandle);
WEAK(cuIpcOpenMemHandle_v2);
WEAK(cuIpcCloseMemHandle);
WEAK(cuIpcGetEventHandle);
WEAK(cuIpcOpenEventHandle);

static size_t free_mem(void) {
    size_t f = 0, t = 0;
    return CU(cuMemGetInfo_v2, &f, &t) == CUDA_SUCCESS ? f : 0;
}

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 8));
}

static int same(const unsigned char *a, const unsigned char *b, size_t n) {
    return memcmp(a, b, n) == 0;
}

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void test_linear(void) {
    enum { N = 3 * 1024 * 1024 + 17 };
    unsigned char *in = malloc(N), *out = malloc(N);
    CUdeviceptr a = 0, b = 0;
    if (!in || !out || !OK_CU(cuMemAlloc_v2, &a, N) || !OK_CU(cuMemAlloc_v2, &b, N))
        return;
    fill(in, N, 1);
    memset(out, 0, N);
    OK_CU(cuMemcpyHtoD_v2, a, in, N);
    OK_CU(cuMemcpyDtoH_v2, out, a, N);
    CHECK(same(in, out, N), "HtoD then DtoH returns the bytes (%d bytes)", N);
    OK_CU(cuMemcpyDtoD_v2, b, a, N);
    memset(out, 0, N);
    OK_CU(cuMemcpyDtoH_v2, out, b, N);
    CHECK(same(in, out, N), "DtoD copies them");
    /* Offsets inside an allocation. */
    OK_CU(cuMemcpyHtoD_v2, a + 1000, in + 5, 4096);
    unsigned char part[4096];
    OK_CU(cuMemcpyDtoH_v2, part, a + 1000, sizeof part);
    CHECK(same(part, in + 5, sizeof part), "a copy at an offset lands there");
    /* Beyond the allocation: refused, nothing written. */
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD_v2, a + N - 8, in, 16);
    /* Unified cuMemcpy in all four directions. */
    fill(in, N, 2);
    OK_CU(cuMemcpy, a, (CUdeviceptr)(uintptr_t)in, N);
    OK_CU(cuMemcpy, b, a, N);
    OK_CU(cuMemcpy, (CUdeviceptr)(uintptr_t)out, b, N);
    CHECK(same(in, out, N), "cuMemcpy host->device->device->host");
    /* Per-thread default stream exports. */
    fill(in, 4096, 3);
    OK_CU(cuMemcpyHtoD_v2_ptds, a, in, 4096);
    OK_CU(cuMemcpyDtoH_v2_ptds, out, a, 4096);
    CHECK(same(in, out, 4096), "cuMemcpyHtoD_v2_ptds / DtoH_v2_ptds round trip");
    OK_CU(cuMemcpy_ptds, (CUdeviceptr)(uintptr_t)out, a, 4096);
    CHECK(same(in, out, 4096), "cuMemcpy_ptds");
    /* Sets. */
    OK_CU(cuMemsetD8_v2, a, 0xab, N);
    OK_CU(cuMemcpyDtoH_v2, out, a, N);
    int ok = 1;
    for (size_t i = 0; i < N; i++)
        ok &= out[i] == 0xab;
    CHECK(ok, "cuMemsetD8_v2 sets every byte");
    OK_CU(cuMemsetD16_v2, a + 2, 0x1234, 8);
    OK_CU(cuMemsetD32_v2, a + 64, 0xdeadbeefu, 4);
    OK_CU(cuMemcpyDtoH_v2, out, a, 128);
    uint16_t s16;
    uint32_t s32;
    memcpy(&s16, out + 2 + 14, 2);
    memcpy(&s32, out + 64 + 12, 4);
    CHECK(s16 == 0x1234 && out[18] == 0xab && s32 == 0xdeadbeefu && out[80] == 0xab,
          "cuMemsetD16_v2 / D32_v2 set exactly their elements (%#x, %#x)", s16, s32);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuMemsetD32_v2, a + 2, 1, 1);
    OK_CU(cuMemsetD32_v2_ptds, a, 0, N / 4);
    OK_CU(cuMemcpyDtoH_v2, out, a, 64);
    CHECK(out[0] == 0 && out[63] == 0, "cuMemsetD32_v2_ptds of zero");
    OK_CU(cuMemFree_v2, a);
    OK_CU(cuMemFree_v2, b);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH_v2, out, a, 16);
    free(in);
    free(out);
}

/* Async copies and sets are ordered after the stream's kernels. */
static void test_async(void) {
    CUmodule mod;
    CUfunction fn;
    CUstream s;
    if (CU(cuModuleLoadData, &mod, sim_module_image()) || CU(cuModuleGetFunction, &fn, mod, sim_kernel_name()) ||
        !OK_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING))
        return;
    enum { N = 1 << 20 };
    unsigned char *h = NULL, *back = malloc(N);
    CUdeviceptr d = 0, e = 0;
    if (!OK_CU(cuMemAllocHost_v2, (void **)&h, N) || !OK_CU(cuMemAlloc_v2, &d, N) || !OK_CU(cuMemAlloc_v2, &e, N))
        return;
    fill(h, N, 4);
    uint64_t ns = 20000000; /* 20 ms */
    void *args[] = {&ns};
    OK_CU(cuLaunchKernel, fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
    OK_CU(cuMemcpyHtoDAsync_v2, d, h, N, s);
    OK_CU(cuMemsetD8Async, e, 0x11, N, s);
    OK_CU(cuMemcpyDtoDAsync_v2, e, d, N / 2, s);
    memset(back, 0, N);
    OK_CU(cuMemcpyDtoHAsync_v2, back, e, N, s);
    OK_CU(cuStreamSynchronize, s);
    int ok = same(back, h, N / 2);
    for (size_t i = N / 2; i < N; i++)
        ok &= back[i] == 0x11;
    CHECK(ok, "async HtoD, set, DtoD, DtoH on one stream apply in stream order");
    OK_CU(cuMemcpyAsync_ptsz, (CUdeviceptr)(uintptr_t)back, d, 64, 0);
    OK_CU(cuCtxSynchronize);
    CHECK(same(back, h, 64), "cuMemcpyAsync_ptsz on the per-thread stream");
    OK_CU(cuMemFree_v2, d);
    OK_CU(cuMemFree_v2, e);
    OK_CU(cuMemFreeHost, h);
    OK_CU(cuStreamDestroy_v2, s);
    OK_CU(cuModuleUnload, mod);
    free(back);
}

static void test_2d_3d(void) {
    enum { W = 100, H = 37, D = 3 };
    CUdeviceptr p = 0;
    size_t pitch = 0;
    if (!OK_CU(cuMemAllocPitch_v2, &p, &pitch, W, H * D, 4))
        return;
    CHECK(pitch >= W, "pitch %zu >= width %d", pitch, W);
    unsigned char src[W * H * D], dst[W * H * D];
    fill(src, sizeof src, 5);
    memset(dst, 0, sizeof dst);
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = src;
    c.srcPitch = W;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = p;
    c.dstPitch = pitch;
    c.WidthInBytes = W;
    c.Height = H;
    OK_CU(cuMemcpy2D_v2, &c);
    CUDA_MEMCPY2D r;
    memset(&r, 0, sizeof r);
    r.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    r.srcDevice = p;
    r.srcPitch = pitch;
    r.dstMemoryType = CU_MEMORYTYPE_HOST;
    r.dstHost = dst;
    r.dstPitch = W;
    r.WidthInBytes = W;
    r.Height = H;
    OK_CU(cuMemcpy2D_v2, &r);
    CHECK(same(src, dst, W * H), "cuMemcpy2D_v2 host -> pitched device -> host");
    /* A sub-rectangle through the async form. */
    memset(dst, 0, sizeof dst);
    r.srcXInBytes = 10;
    r.srcY = 5;
    r.WidthInBytes = 20;
    r.Height = 4;
    OK_CU(cuMemcpy2DAsync_v2, &r, 0);
    OK_CU(cuCtxSynchronize);
    int ok = 1;
    for (int y = 0; y < 4; y++)
        ok &= same(dst + y * W, src + (5 + y) * W + 10, 20);
    CHECK(ok, "cuMemcpy2DAsync_v2 of a sub-rectangle");
    /* Pitched sets. */
    OK_CU(cuMemsetD2D8_v2, p, pitch, 0x7f, W, 2);
    OK_CU(cuMemsetD2D32_v2, p + 2 * pitch, pitch, 0x01020304u, W / 4, 1);
    unsigned char row[W];
    OK_CU(cuMemcpyDtoH_v2, row, p + pitch, W);
    uint32_t w32;
    memcpy(&w32, row + 0, 4);
    CHECK(row[0] == 0x7f && row[W - 1] == 0x7f, "cuMemsetD2D8_v2 sets whole rows");
    OK_CU(cuMemcpyDtoH_v2, row, p + 2 * pitch, W);
    memcpy(&w32, row + W - 4, 4);
    CHECK(w32 == 0x01020304u, "cuMemsetD2D32_v2 sets its row (%#x)", w32);
    /* 3D: D slices of H rows. */
    CUDA_MEMCPY3D t;
    memset(&t, 0, sizeof t);
    t.srcMemoryType = CU_MEMORYTYPE_HOST;
    t.srcHost = src;
    t.srcPitch = W;
    t.srcHeight = H;
    t.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    t.dstDevice = p;
    t.dstPitch = pitch;
    t.dstHeight = H;
    t.WidthInBytes = W;
    t.Height = H;
    t.Depth = D;
    OK_CU(cuMemcpy3D_v2, &t);
    CUDA_MEMCPY3D u = t;
    u.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    u.srcHost = NULL;
    u.srcDevice = p;
    u.srcPitch = pitch;
    u.dstMemoryType = CU_MEMORYTYPE_HOST;
    u.dstDevice = 0;
    u.dstHost = dst;
    u.dstPitch = W;
    memset(dst, 0, sizeof dst);
    OK_CU(cuMemcpy3D_v2, &u);
    CHECK(same(src, dst, sizeof src), "cuMemcpy3D_v2 of %d slices there and back", D);
    OK_CU(cuMemFree_v2, p);
}

static void test_managed_and_sparse(CUdevice dev) {
    CUdeviceptr m = 0;
    if (OK_CU(cuMemAllocManaged, &m, 1 * MiB, CU_MEM_ATTACH_GLOBAL)) {
        unsigned char *cpu = (unsigned char *)(uintptr_t)m;
        memset(cpu, 0x42, MiB);
        unsigned char b[16];
        OK_CU(cuMemcpyDtoH_v2, b, m + 100, sizeof b);
        CHECK(b[0] == 0x42 && b[15] == 0x42, "managed memory the CPU wrote reads back through the driver");
        OK_CU(cuMemsetD8_v2, m, 0x24, 64);
        CHECK(cpu[0] == 0x24 && cpu[63] == 0x24 && cpu[64] == 0x42, "and the CPU sees what the driver set");
        unsigned char managed = 0;
        if (OK_CU(cuPointerGetAttribute, &managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m))
            CHECK(managed == 1, "CU_POINTER_ATTRIBUTE_IS_MANAGED = %d", managed);
        OK_CU(cuMemFree_v2, m);
    }
    /* Most of the device in one allocation, touched at both ends: only
     * the touched bytes cost memory (on a real GPU the memory is there). */
    size_t total = 0;
    CU(cuDeviceTotalMem_v2, &total, dev);
    size_t want = total / 4 * 3, before = free_mem();
    CUdeviceptr big = 0;
    if (before >= want && OK_CU(cuMemAlloc_v2, &big, want)) {
        uint64_t v = 0x0123456789abcdefull, w = 0;
        OK_CU(cuMemcpyHtoD_v2, big + want - 8, &v, 8);
        OK_CU(cuMemcpyHtoD_v2, big, &v, 8);
        OK_CU(cuMemcpyDtoH_v2, &w, big + want - 8, 8);
        CHECK(w == v, "a %zu MiB allocation holds a value at its end", (size_t)(want / MiB));
        if (getenv("VGPU_SIM_DIR")) {
            /* The sim's fresh memory is zero (a real GPU's is whatever was there). */
            w = 1;
            OK_CU(cuMemcpyDtoH_v2, &w, big + want / 2, 8);
            CHECK(w == 0, "untouched memory of a fresh allocation reads zero (%llu)", (unsigned long long)w);
        }
        OK_CU(cuMemFree_v2, big);
    }
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Many allocations, each touched: device memory costs the process no
 * resource per allocation beyond the bytes (no descriptor each). */
static void test_many_touched(void) {
    enum { K = 2000 };
    static CUdeviceptr p[K];
    int before = open_fds(), made = 0;
    for (int i = 0; i < K; i++) {
        if (CU(cuMemAlloc_v2, &p[i], 4096) != CUDA_SUCCESS)
            break;
        unsigned v = (unsigned)i;
        if (CU(cuMemcpyHtoD_v2, p[i] + 100, &v, 4) != CUDA_SUCCESS)
            break;
        made++;
    }
    CHECK(made == K, "%d of %d allocations made and written", made, K);
    int ok = 1;
    for (int i = 0; i < made; i++) {
        unsigned v = 0;
        ok &= CU(cuMemcpyDtoH_v2, &v, p[i] + 100, 4) == CUDA_SUCCESS && v == (unsigned)i;
    }
    CHECK(ok, "each of them holds its own value");
    int after = open_fds();
    CHECK(after - before <= 8, "%d touched allocations cost %d file descriptors", made, after - before);
    for (int i = 0; i < made; i++)
        CU(cuMemFree_v2, p[i]);
}

static void test_pointers(CUdevice dev) {
    CUdeviceptr p = 0;
    if (!OK_CU(cuMemAlloc_v2, &p, 5 * MiB))
        return;
    unsigned int type = 0;
    int ordinal = -1;
    CUcontext ctx = NULL, cur = NULL;
    CU(cuCtxGetCurrent, &cur);
    if (OK_CU(cuPointerGetAttribute, &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 1234))
        CHECK(type == CU_MEMORYTYPE_DEVICE, "memory type of a device pointer = %u", type);
    if (OK_CU(cuPointerGetAttribute, &ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p))
        CHECK(ordinal == dev, "device ordinal = %d", ordinal);
    if (OK_CU(cuPointerGetAttribute, &ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p))
        CHECK(ctx == cur, "context of the allocation is the current one");
    CUdeviceptr base = 0;
    size_t size = 0;
    if (OK_CU(cuMemGetAddressRange_v2, &base, &size, p + 4 * MiB))
        CHECK(base == p && size == 5 * MiB, "cuMemGetAddressRange_v2 = [%#llx, +%zu)", (unsigned long long)base, size);
    CHECK_CU(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange_v2, &base, &size, (CUdeviceptr)0x10);
    CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuPointerGetAttribute, &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
             (CUdeviceptr)(uintptr_t)&type);
    /* The plural form answers defaults for a non-CUDA pointer. */
    CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED};
    unsigned int t2 = 99;
    unsigned char mg = 99;
    void *data[2] = {&t2, &mg};
    if (OK_CU(cuPointerGetAttributes, 2, attrs, data, (CUdeviceptr)(uintptr_t)&type))
        CHECK(t2 == 0 && mg == 0, "cuPointerGetAttributes of host stack memory: zeros (%u, %u)", t2, mg);
    if (OK_CU(cuPointerGetAttributes, 2, attrs, data, p))
        CHECK(t2 == CU_MEMORYTYPE_DEVICE && mg == 0, "cuPointerGetAttributes of device memory");
    void *h = NULL;
    if (OK_CU(cuMemAllocHost_v2, &h, 4096)) {
        if (OK_CU(cuPointerGetAttribute, &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h))
            CHECK(type == CU_MEMORYTYPE_HOST, "memory type of cuMemAllocHost memory = %u", type);
        OK_CU(cuMemFreeHost, h);
    }
    OK_CU(cuMemFree_v2, p);
}

/* ---- IPC across two processes ------------------------------------------ */

static void hex(char *out, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
}

static int unhex(void *p, const char *s, size_t n) {
    if (strlen(s) != 2 * n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return 0;
        ((unsigned char *)p)[i] = (unsigned char)v;
    }
    return 1;
}

enum { IPC_N = 2 * 1024 * 1024 };

static int ipc_child(int argc, char **argv) {
    g_prog = "cuda_data ipc-child";
    CUipcMemHandle mh;
    CUipcEventHandle eh;
    unsigned long long deadline = 0;
    if (argc != 5 || !unhex(&mh, argv[2], sizeof mh) || !unhex(&eh, argv[3], sizeof eh) ||
        sscanf(argv[4], "%llu", &deadline) != 1) {
        fprintf(stderr, "usage: cuda_data ipc-child MEM EVENT DEADLINE_NS\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    if (!OK_CU(cuInit, 0) || !OK_CU(cuDeviceGet, &dev, 0) || !OK_CU(cuDevicePrimaryCtxRetain, &ctx, dev) ||
        !OK_CU(cuCtxSetCurrent, ctx))
        return finish();
    CUevent ev;
    if (OK_CU(cuIpcOpenEventHandle, &ev, eh)) {
        OK_CU(cuEventSynchronize, ev);
        unsigned long long now = now_ns();
        CHECK(now >= deadline, "the exporter's event happened after its kernel (%.1f ms past the kernel's end)",
              ((double)now - (double)deadline) / 1e6);
        OK_CU(cuEventQuery, ev);
        OK_CU(cuEventDestroy_v2, ev);
    }
    size_t before = free_mem();
    CUdeviceptr p = 0;
    if (OK_CU(cuIpcOpenMemHandle_v2, &p, mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) {
        CHECK(free_mem() == before, "opening another process's memory charges this one nothing");
        unsigned char *want = malloc(IPC_N), *got = malloc(IPC_N);
        fill(want, IPC_N, 9);
        OK_CU(cuMemcpyDtoH_v2, got, p, IPC_N);
        CHECK(same(want, got, IPC_N), "the importer reads the exporter's bytes");
        memset(got, 0x5e, 4096);
        OK_CU(cuMemcpyHtoD_v2, p + 4096, got, 4096);
        OK_CU(cuIpcCloseMemHandle, p);
        free(want);
        free(got);
    }
    OK_CU(cuDevicePrimaryCtxRelease_v2, dev);
    return finish();
}

static void test_ipc(const char *self) {
    CUdeviceptr p = 0;
    size_t before = free_mem();
    if (!OK_CU(cuMemAlloc_v2, &p, IPC_N))
        return;
    unsigned char *b = malloc(IPC_N);
    fill(b, IPC_N, 9);
    OK_CU(cuMemcpyHtoD_v2, p, b, IPC_N);
    CUipcMemHandle mh;
    CUipcEventHandle eh;
    CUevent ev;
    if (!OK_CU(cuIpcGetMemHandle, &mh, p) ||
        !OK_CU(cuEventCreate, &ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING) ||
        !OK_CU(cuIpcGetEventHandle, &eh, ev))
        return;
    CUevent plain;
    if (OK_CU(cuEventCreate, &plain, CU_EVENT_DEFAULT)) {
        CUipcEventHandle bad;
        CHECK_CU(CUDA_ERROR_INVALID_VALUE, cuIpcGetEventHandle, &bad, plain);
        OK_CU(cuEventDestroy_v2, plain);
    }
    /* A 300 ms kernel, then the event: the importer must wait for it. */
    CUmodule mod;
    CUfunction fn;
    unsigned long long deadline = now_ns();
    if (!CU(cuModuleLoadData, &mod, sim_module_image()) && !CU(cuModuleGetFunction, &fn, mod, sim_kernel_name())) {
        uint64_t ns = 300000000;
        void *args[] = {&ns};
        deadline = now_ns() + ns;
        OK_CU(cuLaunchKernel, fn, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL);
    }
    OK_CU(cuEventRecord, ev, 0);
    char mhx[2 * sizeof mh + 1], ehx[2 * sizeof eh + 1], dl[32];
    hex(mhx, &mh, sizeof mh);
    hex(ehx, &eh, sizeof eh);
    snprintf(dl, sizeof dl, "%llu", deadline);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "ipc-child", mhx, ehx, dl, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "the importer process ran clean (status %d)", st);
    CHECK(before - free_mem() >= IPC_N, "the exported memory stays charged to its owner");
    unsigned char back[4096];
    OK_CU(cuMemcpyDtoH_v2, back, p + 4096, sizeof back);
    CHECK(back[0] == 0x5e && back[4095] == 0x5e, "the owner sees what the importer wrote");
    OK_CU(cuCtxSynchronize);
    OK_CU(cuEventDestroy_v2, ev);
    OK_CU(cuMemFree_v2, p);
    free(b);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "ipc-child") == 0)
        return ipc_child(argc, argv);
    g_prog = "cuda_data";
    CUdevice dev;
    CUcontext ctx;
    if (!OK_CU(cuInit, 0) || !OK_CU(cuDeviceGet, &dev, 0) || !OK_CU(cuDevicePrimaryCtxRetain, &ctx, dev) ||
        !OK_CU(cuCtxSetCurrent, ctx))
        return finish();
    test_linear();
    test_async();
    test_2d_3d();
    test_managed_and_sparse(dev);
    test_pointers(dev);
    test_many_touched();
    test_ipc("/proc/self/exe");
    OK_CU(cuDevicePrimaryCtxRelease_v2, dev);
    return finish();
}
