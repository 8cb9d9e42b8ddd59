/* teardown: driver calls from a C++ thread-local destructor and from an
 * atexit handler return cleanly, as C++ runtimes make them when they
 * release primary contexts at thread and process exit. Each holder is
 * made before the thread's first driver call, so its destructor runs
 * after anything the driver keeps per thread has been torn down.
 * Prints PASS/FAIL lines (the atexit handler prints its own summary and
 * turns a failure into exit status 1).
 */
#define CHECK_CUDA 1
#include "check.h"

#include <thread>
#include <unistd.h>

WEAK(cuInit);
WEAK(cuDeviceGet);
WEAK(cuDevicePrimaryCtxRetain);
WEAK(cuDevicePrimaryCtxRelease_v2);
WEAK(cuCtxSetCurrent);
WEAK(cuCtxGetCurrent);
WEAK(cuCtxSynchronize);
WEAK(cuMemAlloc_v2);
WEAK(cuMemFree_v2);
WEAK(cuMemGetInfo_v2);

static CUresult g_free = (CUresult)NOT_EXPORTED, g_release = (CUresult)NOT_EXPORTED,
                g_current = (CUresult)NOT_EXPORTED;
static CUcontext g_seen = nullptr, g_made = nullptr;

struct Holder {
    CUdevice dev = 0;
    CUdeviceptr p = 0;
    bool held = false;
    ~Holder() {
        if (!held)
            return;
        g_current = CU(cuCtxGetCurrent, &g_seen);
        g_free = CU(cuMemFree_v2, p);
        g_release = CU(cuDevicePrimaryCtxRelease_v2, dev);
    }
};

static thread_local Holder t_holder;

static void worker() {
    Holder &h = t_holder; /* constructed (and its destructor registered) first */
    CUcontext c = nullptr;
    if (CU(cuDeviceGet, &h.dev, 0) || CU(cuDevicePrimaryCtxRetain, &c, h.dev) || CU(cuCtxSetCurrent, c) ||
        CU(cuMemAlloc_v2, &h.p, 1 << 20))
        return;
    g_made = c;
    h.held = true;
}

static CUdevice g_dev;

static void at_exit() {
    g_pass = g_fail = 0;
    g_prog = "teardown atexit";
    OK_CU(cuCtxSynchronize);
    size_t f = 0, t = 0;
    OK_CU(cuMemGetInfo_v2, &f, &t);
    OK_CU(cuDevicePrimaryCtxRelease_v2, g_dev);
    if (finish() != 0)
        _exit(1);
}

int main() {
    g_prog = "teardown";
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (!OK_CU(cuInit, 0) || !OK_CU(cuDeviceGet, &g_dev, 0))
        return finish();
    std::thread th(worker);
    th.join();
    CHECK(g_made != nullptr, "the worker thread made a context and an allocation");
    CHECK(g_current == CUDA_SUCCESS && g_seen == g_made,
          "cuCtxGetCurrent from a thread_local destructor: %s, its context still current",
          cu_name(g_current));
    CHECK(g_free == CUDA_SUCCESS, "cuMemFree_v2 from a thread_local destructor: %s", cu_name(g_free));
    CHECK(g_release == CUDA_SUCCESS, "cuDevicePrimaryCtxRelease_v2 from a thread_local destructor: %s",
          cu_name(g_release));
    /* The main thread: an atexit handler registered before its first
     * context, so it runs after this thread's TLS destructors. */
    atexit(at_exit);
    CUcontext c = nullptr;
    OK_CU(cuDevicePrimaryCtxRetain, &c, g_dev);
    OK_CU(cuCtxSetCurrent, c);
    return finish();
}
