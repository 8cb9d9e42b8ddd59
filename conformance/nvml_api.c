/* nvml_api: every NVML entry of issue 2, through NVIDIA's nvml.h.
 *
 * Built with NVML_NO_UNVERSIONED_FUNC_DEFS so that both the old and the
 * versioned exports (nvmlInit / nvmlInit_v2, ..._v2, ..._v3) can be called
 * by their real names. Cross-checks NVML against the CUDA driver API of the
 * same machine: device count, UUIDs, PCI ids, driver version, and this
 * process's own context and memory in the compute-process list.
 * Optional: CONF_EXPECT_DEVICES, CONF_EXPECT_TOTAL_MEM.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#define CHECK_CUDA 1
#define CHECK_NVML 1
#include "check.h"
#include "sim_kernel.h"

#include <unistd.h>

WEAK(nvmlInit);
WEAK(nvmlInit_v2);
WEAK(nvmlInitWithFlags);
WEAK(nvmlShutdown);
WEAK(nvmlErrorString);
WEAK(nvmlDeviceGetCount);
WEAK(nvmlDeviceGetCount_v2);
WEAK(nvmlDeviceGetHandleByIndex);
WEAK(nvmlDeviceGetHandleByIndex_v2);
WEAK(nvmlDeviceGetHandleByUUID);
WEAK(nvmlDeviceGetUUID);
WEAK(nvmlDeviceGetName);
WEAK(nvmlDeviceGetIndex);
WEAK(nvmlDeviceGetMemoryInfo);
WEAK(nvmlDeviceGetMemoryInfo_v2);
WEAK(nvmlDeviceGetComputeRunningProcesses);
WEAK(nvmlDeviceGetComputeRunningProcesses_v2);
WEAK(nvmlDeviceGetComputeRunningProcesses_v3);
WEAK(nvmlDeviceGetProcessUtilization);
WEAK(nvmlDeviceGetUtilizationRates);
WEAK(nvmlDeviceGetPciInfo);
WEAK(nvmlDeviceGetPciInfo_v2);
WEAK(nvmlDeviceGetPciInfo_v3);
WEAK(nvmlSystemGetDriverVersion);
WEAK(nvmlSystemGetCudaDriverVersion);
WEAK(nvmlSystemGetCudaDriverVersion_v2);
WEAK(nvmlSystemGetNVMLVersion);

WEAK(cuInit);
WEAK(cuDriverGetVersion);
WEAK(cuDeviceGet);
WEAK(cuDeviceGetCount);
WEAK(cuDeviceGetUuid_v2);
WEAK(cuDeviceGetAttribute);
WEAK(cuDeviceTotalMem_v2);
WEAK(cuCtxDestroy_v2);
WEAK(cuMemAlloc_v2);
WEAK(cuMemFree_v2);
WEAK(cuModuleLoadData);
WEAK(cuModuleGetFunction);
WEAK(cuLaunchKernel);
WEAK(cuCtxSynchronize);

#define MiB (1024ull * 1024ull)

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from CUDA's 16 bytes. */
static void uuid_string(const CUuuid *u, char out[64]) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, 64,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static void test_lifecycle(void) {
    unsigned n = 0;
    CHECK_NV(NVML_ERROR_UNINITIALIZED, nvmlDeviceGetCount_v2, &n);
    if (OK_NV(nvmlInit)) /* the v1 export */
        OK_NV(nvmlShutdown);
    if (OK_NV(nvmlInitWithFlags, 0))
        OK_NV(nvmlShutdown);
    CHECK_NV(NVML_ERROR_UNINITIALIZED, nvmlDeviceGetCount_v2, &n);
    /* Reference counted: two inits need two shutdowns. */
    OK_NV(nvmlInit_v2);
    OK_NV(nvmlInit_v2);
    OK_NV(nvmlShutdown);
    OK_NV(nvmlDeviceGetCount_v2, &n);
    OK_NV(nvmlShutdown);
    CHECK_NV(NVML_ERROR_UNINITIALIZED, nvmlDeviceGetCount_v2, &n);

    const char *s = (void *)&nvmlErrorString ? nvmlErrorString(NVML_ERROR_NOT_FOUND) : NULL;
    CHECK(s && strcmp(s, "Not Found") == 0, "nvmlErrorString(NOT_FOUND) = \"%s\"", s ? s : "(null)");
    s = (void *)&nvmlErrorString ? nvmlErrorString(NVML_SUCCESS) : NULL;
    CHECK(s && strcmp(s, "Success") == 0, "nvmlErrorString(SUCCESS) = \"%s\"", s ? s : "(null)");
    s = (void *)&nvmlErrorString ? nvmlErrorString((nvmlReturn_t)77777) : NULL;
    CHECK(s && *s, "nvmlErrorString(unknown) = \"%s\"", s ? s : "(null)");
}

static void test_system(void) {
    char ver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {0};
    if (OK_NV(nvmlSystemGetDriverVersion, ver, sizeof ver))
        CHECK(ver[0] >= '0' && ver[0] <= '9' && strchr(ver, '.'), "driver version \"%s\"", ver);
    char tiny[2];
    CHECK_NV(NVML_ERROR_INSUFFICIENT_SIZE, nvmlSystemGetDriverVersion, tiny, sizeof tiny);
    char nv[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE] = {0};
    if (OK_NV(nvmlSystemGetNVMLVersion, nv, sizeof nv))
        CHECK(nv[0] >= '0' && nv[0] <= '9' && strchr(nv, '.'), "NVML version \"%s\"", nv);
    int v1 = 0, v2 = 0, cu = 0;
    OK_NV(nvmlSystemGetCudaDriverVersion, &v1);
    OK_NV(nvmlSystemGetCudaDriverVersion_v2, &v2);
    OK_CU(cuDriverGetVersion, &cu);
    CHECK(v1 == cu && v2 == cu, "NVML CUDA driver version %d / %d == cuDriverGetVersion %d", v1, v2,
          cu);
    CHECK_NV(NVML_ERROR_INVALID_ARGUMENT, nvmlSystemGetCudaDriverVersion_v2, NULL);
}

static void test_devices(unsigned *count) {
    unsigned n1 = 0, n2 = 0;
    unsigned long long want;
    OK_NV(nvmlDeviceGetCount, &n1);
    OK_NV(nvmlDeviceGetCount_v2, &n2);
    int cun = -1;
    OK_CU(cuDeviceGetCount, &cun);
    CHECK(n1 == n2 && (int)n2 == cun, "nvmlDeviceGetCount %u, _v2 %u, CUDA %d agree", n1, n2, cun);
    if (expect_env("CONF_EXPECT_DEVICES", &want))
        CHECK(n2 == want, "NVML device count %u == %llu", n2, want);
    *count = n2;
    nvmlDevice_t h;
    CHECK_NV(NVML_ERROR_INVALID_ARGUMENT, nvmlDeviceGetHandleByIndex_v2, n2, &h);
    CHECK_NV(NVML_ERROR_INVALID_ARGUMENT, nvmlDeviceGetHandleByIndex_v2, 0, NULL);
    CHECK_NV(NVML_ERROR_NOT_FOUND, nvmlDeviceGetHandleByUUID,
             "GPU-00000000-0000-0000-0000-000000000000", &h);
    for (unsigned i = 0; i < n2; i++) {
        printf("# device %u\n", i);
        nvmlDevice_t a = NULL, b = NULL, c = NULL;
        OK_NV(nvmlDeviceGetHandleByIndex, i, &a);
        if (!OK_NV(nvmlDeviceGetHandleByIndex_v2, i, &b))
            continue;
        CHECK(a == b, "nvmlDeviceGetHandleByIndex and _v2 agree");
        unsigned idx = 999;
        if (OK_NV(nvmlDeviceGetIndex, b, &idx))
            CHECK(idx == i, "nvmlDeviceGetIndex = %u", idx);
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {0};
        if (OK_NV(nvmlDeviceGetUUID, b, uuid, sizeof uuid)) {
            CHECK(strncmp(uuid, "GPU-", 4) == 0 && strlen(uuid) == 40, "UUID \"%s\"", uuid);
            if (OK_NV(nvmlDeviceGetHandleByUUID, uuid, &c))
                CHECK(c == b, "nvmlDeviceGetHandleByUUID round-trips");
            CUdevice d;
            CUuuid cu;
            char cus[64] = "";
            if (CU(cuDeviceGet, &d, (int)i) == CUDA_SUCCESS &&
                CU(cuDeviceGetUuid_v2, &cu, d) == CUDA_SUCCESS)
                uuid_string(&cu, cus);
            CHECK(strcmp(cus, uuid) == 0, "NVML UUID == CUDA UUID of device %u (%s)", i, cus);
        }
        char small[8];
        CHECK_NV(NVML_ERROR_INSUFFICIENT_SIZE, nvmlDeviceGetUUID, b, small, sizeof small);
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {0};
        if (OK_NV(nvmlDeviceGetName, b, name, sizeof name))
            CHECK(name[0] != 0, "name \"%s\"", name);

        nvmlPciInfo_t p1, p3;
        memset(&p1, 0, sizeof p1);
        memset(&p3, 0, sizeof p3);
        int g1 = OK_NV(nvmlDeviceGetPciInfo, b, &p1);
        OK_NV(nvmlDeviceGetPciInfo_v2, b, &p1);
        if (OK_NV(nvmlDeviceGetPciInfo_v3, b, &p3)) {
            char want_id[32];
            snprintf(want_id, sizeof want_id, "%08x:%02x:%02x.0", p3.domain, p3.bus, p3.device);
            CHECK(strcasecmp(p3.busId, want_id) == 0, "busId \"%s\" matches its fields", p3.busId);
            CHECK(p3.pciDeviceId != 0, "pciDeviceId 0x%08x", p3.pciDeviceId);
            if (g1)
                CHECK(p1.bus == p3.bus && p1.device == p3.device && p1.domain == p3.domain,
                      "old and _v3 PCI info agree");
            CUdevice d = (CUdevice)i;
            int bus = -1, dev = -1, dom = -1;
            CU(cuDeviceGetAttribute, &bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d);
            CU(cuDeviceGetAttribute, &dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d);
            CU(cuDeviceGetAttribute, &dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d);
            CHECK((int)p3.bus == bus && (int)p3.device == dev && (int)p3.domain == dom,
                  "NVML PCI %x:%x:%x == CUDA %x:%x:%x", p3.domain, p3.bus, p3.device, dom, bus, dev);
        }

        nvmlMemory_t m;
        if (OK_NV(nvmlDeviceGetMemoryInfo, b, &m)) {
            CHECK(m.total > 0 && m.used + m.free == m.total, "memory total %llu = used %llu + free %llu",
                  m.total, m.used, m.free);
            size_t cut = 0;
            CU(cuDeviceTotalMem_v2, &cut, (CUdevice)i);
            CHECK(m.total == cut, "NVML total %llu == cuDeviceTotalMem_v2 %zu", m.total, cut);
            if (expect_env("CONF_EXPECT_TOTAL_MEM", &want))
                CHECK(m.total == want, "NVML total %llu == %llu", m.total, want);
        }
        nvmlMemory_v2_t m2;
        memset(&m2, 0, sizeof m2);
        m2.version = nvmlMemory_v2;
        if (OK_NV(nvmlDeviceGetMemoryInfo_v2, b, &m2))
            CHECK(m2.total == m.total && m2.reserved + m2.used + m2.free == m2.total,
                  "memory v2 total %llu = reserved %llu + used %llu + free %llu", m2.total,
                  m2.reserved, m2.used, m2.free);
        m2.version = 1;
        CHECK_NV(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvmlDeviceGetMemoryInfo_v2, b, &m2);

        nvmlUtilization_t u = {101, 101};
        if (OK_NV(nvmlDeviceGetUtilizationRates, b, &u))
            CHECK(u.gpu <= 100 && u.memory <= 100, "utilization gpu %u%% memory %u%%", u.gpu,
                  u.memory);
    }
}

/* This process's entry in each version of the compute-process list. */
static void test_processes(nvmlDevice_t h, int expect_present, unsigned long long min_mem) {
    unsigned pid = (unsigned)getpid();
    const char *what = expect_present ? "with a context" : "without a context";
    unsigned n = 0;
    /* The size query: SUCCESS with 0 when the list is empty, else
     * INSUFFICIENT_SIZE with the count (others may use a real GPU). */
    nvmlReturn_t r = NV(nvmlDeviceGetComputeRunningProcesses_v3, h, &n, NULL);
    if (expect_present)
        CHECK(r == NVML_ERROR_INSUFFICIENT_SIZE && n >= 1,
              "process list %s: size query says INSUFFICIENT_SIZE, count %u (got %s)", what, n,
              nvml_name(r));
    else
        CHECK((r == NVML_SUCCESS && n == 0) || (r == NVML_ERROR_INSUFFICIENT_SIZE && n >= 1),
              "process list %s: size query %s, count %u", what, nvml_name(r), n);

    nvmlProcessInfo_t v3[64];
    n = 64;
    memset(v3, 0, sizeof v3);
    int found = 0;
    if (OK_NV(nvmlDeviceGetComputeRunningProcesses_v3, h, &n, v3)) {
        for (unsigned i = 0; i < n; i++) {
            if (v3[i].pid != pid)
                continue;
            found = 1;
            CHECK(v3[i].usedGpuMemory >= min_mem && v3[i].usedGpuMemory != (unsigned long long)NVML_VALUE_NOT_AVAILABLE,
                  "_v3: pid %u uses %llu bytes (>= %llu)", pid, v3[i].usedGpuMemory, min_mem);
        }
        CHECK(found == expect_present, "_v3: pid %u %s the list", pid,
              expect_present ? "is in" : "is not in");
    }
    nvmlProcessInfo_v2_t v2[64];
    n = 64;
    found = 0;
    if (OK_NV(nvmlDeviceGetComputeRunningProcesses_v2, h, &n, v2)) {
        for (unsigned i = 0; i < n; i++)
            if (v2[i].pid == pid && v2[i].usedGpuMemory >= min_mem)
                found = 1;
        CHECK(found == expect_present, "_v2: pid %u %s", pid, expect_present ? "listed" : "absent");
    }
    nvmlProcessInfo_v1_t v1[64];
    n = 64;
    found = 0;
    if (OK_NV(nvmlDeviceGetComputeRunningProcesses, h, &n, v1)) {
        for (unsigned i = 0; i < n; i++)
            if (v1[i].pid == pid && v1[i].usedGpuMemory >= min_mem)
                found = 1;
        CHECK(found == expect_present, "v1: pid %u %s", pid, expect_present ? "listed" : "absent");
    }
}

static void test_process_utilization(nvmlDevice_t h) {
    CUmodule mod;
    CUfunction fn;
    if (!OK_CU(cuModuleLoadData, &mod, sim_module_image()) ||
        !OK_CU(cuModuleGetFunction, &fn, mod, sim_kernel_name()))
        return;
    int sms = 1;
    CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
    /* Four full waves of 50 ms blocks: about 200 ms of simulated work. */
    uint64_t block_ns = 50000000;
    void *args[] = {&block_ns};
    OK_CU(cuLaunchKernel, fn, 4 * sms, 1, 1, 128, 1, 1, 0, NULL, args, NULL);
    OK_CU(cuCtxSynchronize);
    unsigned n = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetProcessUtilization, h, NULL, &n, 0);
    CHECK(r == NVML_ERROR_INSUFFICIENT_SIZE && n >= 1,
          "nvmlDeviceGetProcessUtilization size query: INSUFFICIENT_SIZE, count %u (got %s)", n,
          nvml_name(r));
    nvmlProcessUtilizationSample_t s[64];
    memset(s, 0, sizeof s);
    n = 64;
    if (OK_NV(nvmlDeviceGetProcessUtilization, h, s, &n, 0)) {
        int found = 0;
        for (unsigned i = 0; i < n; i++) {
            if (s[i].pid != (unsigned)getpid())
                continue;
            found = 1;
            CHECK(s[i].smUtil > 0 && s[i].smUtil <= 100 && s[i].timeStamp > 0,
                  "own sample: smUtil %u%%, timeStamp %llu", s[i].smUtil, s[i].timeStamp);
        }
        CHECK(found, "own pid %d has a utilization sample", (int)getpid());
    }
    /* A timestamp from the future: nothing newer exists. */
    n = 64;
    CHECK_NV(NVML_ERROR_NOT_FOUND, nvmlDeviceGetProcessUtilization, h, s, &n, ~0ull >> 1);
    nvmlUtilization_t u;
    if (OK_NV(nvmlDeviceGetUtilizationRates, h, &u))
        CHECK(u.gpu > 0 && u.gpu <= 100, "device utilization after work: %u%%", u.gpu);
}

int main(void) {
    g_prog = "nvml_api";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!OK_CU(cuInit, 0))
        return finish();
    test_lifecycle();
    if (!OK_NV(nvmlInit_v2))
        return finish();
    test_system();
    unsigned count = 0;
    test_devices(&count);
    if (count < 1)
        return finish();
    nvmlDevice_t h;
    if (!OK_NV(nvmlDeviceGetHandleByIndex_v2, 0, &h))
        return finish();
    printf("# process list of device 0\n");
    test_processes(h, 0, 0);
    CUcontext ctx;
    if (!OK_CU(conf_cuCtxCreate_v2, &ctx, 0, 0))
        return finish();
    CUdeviceptr p;
    if (OK_CU(cuMemAlloc_v2, &p, 96 * MiB)) {
        test_processes(h, 1, 96 * MiB);
        nvmlMemory_t m;
        if (OK_NV(nvmlDeviceGetMemoryInfo, h, &m))
            CHECK(m.used >= 96 * MiB, "device used %llu includes our 96 MiB", m.used);
        OK_CU(cuMemFree_v2, p);
    }
    printf("# utilization\n");
    test_process_utilization(h);
    OK_CU(cuCtxDestroy_v2, ctx);
    printf("# after cuCtxDestroy_v2\n");
    test_processes(h, 0, 0);
    OK_NV(nvmlShutdown);
    return finish();
}
