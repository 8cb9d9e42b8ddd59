/* Shared check helpers for the conformance programs.
 *
 * Every check prints one line, `PASS <what>` or `FAIL <what>: <why>
 * [file:line]`, and `finish()` prints `<prog>: N passed, M failed` and
 * returns the exit status (1 when anything failed). The programs are built
 * against NVIDIA's own cuda.h/nvml.h; they never trust the library under
 * test to name its own error codes (the tables below come from the
 * headers' enums).
 *
 * Entry points are declared weak (WEAK below) so that a driver library
 * missing one export still links and runs: the call is reported as FAIL
 * "not exported" instead of the whole program failing to link or load.
 * Weak references do not make a library "needed" for an --as-needed
 * linker: link with -Wl,--no-as-needed -lcuda -lnvidia-ml.
 */
#ifndef VGPU_CONFORMANCE_CHECK_H
#define VGPU_CONFORMANCE_CHECK_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_pass, g_fail;
static const char *g_prog = "conformance";

/* A value no driver returns: marks a call to an entry the library lacks. */
#define NOT_EXPORTED 0x7ffffff0u

#define WEAK(f) extern __typeof__(f) f __attribute__((weak))

static __attribute__((unused)) void pass_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static __attribute__((unused)) void pass_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("PASS ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    g_pass++;
}

static __attribute__((unused)) void fail_(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static __attribute__((unused)) void fail_(int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL ", stdout);
    vprintf(fmt, ap);
    printf(" [%s:%d]\n", g_prog, line);
    va_end(ap);
    g_fail++;
    fflush(stdout);
}

/* CHECK(cond, "what %d", ...): a plain condition. Returns cond. */
#define CHECK(cond, ...) check_cond_(__LINE__, !!(cond), #cond, __VA_ARGS__)
static __attribute__((unused)) int check_cond_(int line, int ok, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static __attribute__((unused)) int check_cond_(int line, int ok, const char *expr, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (ok)
        pass_("%s", what);
    else
        fail_(line, "%s: expected %s", what, expr);
    return ok;
}

static __attribute__((unused)) int finish(void) {
    printf("%s: %d passed, %d failed\n", g_prog, g_pass, g_fail);
    fflush(stdout);
    return g_fail ? 1 : 0;
}

/* Optional expectations the test harness passes in (e.g. the sim profile's
 * device count); unset means "do not check". */
static __attribute__((unused)) int expect_env(const char *name, unsigned long long *out) {
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return 0;
    *out = strtoull(v, &end, 0);
    if (*end) {
        fprintf(stderr, "%s: bad %s=%s\n", g_prog, name, v);
        exit(2);
    }
    return 1;
}

#ifdef CHECK_CUDA
#include <cuda.h>

static __attribute__((unused)) const char *cu_name(unsigned r) {
    switch (r) {
#define N(x) case x: return #x;
        N(CUDA_SUCCESS) N(CUDA_ERROR_INVALID_VALUE) N(CUDA_ERROR_OUT_OF_MEMORY)
        N(CUDA_ERROR_NOT_INITIALIZED) N(CUDA_ERROR_DEINITIALIZED)
        N(CUDA_ERROR_STUB_LIBRARY) N(CUDA_ERROR_NO_DEVICE) N(CUDA_ERROR_INVALID_DEVICE)
        N(CUDA_ERROR_INVALID_IMAGE) N(CUDA_ERROR_INVALID_PTX) N(CUDA_ERROR_INVALID_CONTEXT)
        N(CUDA_ERROR_INVALID_HANDLE) N(CUDA_ERROR_ILLEGAL_STATE) N(CUDA_ERROR_NOT_FOUND)
        N(CUDA_ERROR_NOT_READY) N(CUDA_ERROR_LAUNCH_FAILED)
        N(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) N(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE)
        N(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) N(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
        N(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE) N(CUDA_ERROR_CONTEXT_IS_DESTROYED)
        N(CUDA_ERROR_NOT_PERMITTED) N(CUDA_ERROR_NOT_SUPPORTED) N(CUDA_ERROR_ALREADY_MAPPED)
        N(CUDA_ERROR_NOT_MAPPED) N(CUDA_ERROR_INVALID_SOURCE) N(CUDA_ERROR_UNKNOWN)
#undef N
    case NOT_EXPORTED:
        return "<not exported by the library>";
    default:
        return "<unknown code>";
    }
}

/* Exports that some cuda.h versions no longer declare (13.0 dropped
 * cuCtxCreate_v2/_v3 from the header; drivers still export them), declared
 * here by their ABI so the programs build against 12.x and 13.x headers. */
extern CUresult conf_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
    __asm__("cuCtxCreate_v2") __attribute__((weak));
extern CUresult conf_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                    int numParams, unsigned int flags, CUdevice dev)
    __asm__("cuCtxCreate_v3") __attribute__((weak));

/* Names as the library exports them (asm-labelled aliases are conf_*). */
static __attribute__((unused)) const char *export_name(const char *fn) {
    return strncmp(fn, "conf_", 5) == 0 ? fn + 5 : fn;
}

/* CU(fn, args...): call fn unless the library lacks it. */
#define CU(fn, ...) ((void *)&(fn) == NULL ? (CUresult)NOT_EXPORTED : fn(__VA_ARGS__))

/* CHECK_CU(want, fn, args...): the call returns `want`. Returns 1 if so. */
#define CHECK_CU(want, fn, ...) check_cu_(__LINE__, #fn, #want, (want), CU(fn, __VA_ARGS__))
#define OK_CU(fn, ...) CHECK_CU(CUDA_SUCCESS, fn, __VA_ARGS__)
static __attribute__((unused)) int check_cu_(int line, const char *fn, const char *wname, CUresult want, CUresult got) {
    fn = export_name(fn);
    if (got == want) {
        if (want == CUDA_SUCCESS)
            pass_("%s", fn);
        else
            pass_("%s -> %s", fn, wname);
        return 1;
    }
    fail_(line, "%s: returned %s (%u), expected %s", fn, cu_name(got), (unsigned)got, wname);
    return 0;
}
#endif /* CHECK_CUDA */

#ifdef CHECK_NVML
#include <nvml.h>

static __attribute__((unused)) const char *nvml_name(unsigned r) {
    switch (r) {
#define N(x) case x: return #x;
        N(NVML_SUCCESS) N(NVML_ERROR_UNINITIALIZED) N(NVML_ERROR_INVALID_ARGUMENT)
        N(NVML_ERROR_NOT_SUPPORTED) N(NVML_ERROR_NO_PERMISSION)
        N(NVML_ERROR_ALREADY_INITIALIZED) N(NVML_ERROR_NOT_FOUND)
        N(NVML_ERROR_INSUFFICIENT_SIZE) N(NVML_ERROR_DRIVER_NOT_LOADED)
        N(NVML_ERROR_TIMEOUT) N(NVML_ERROR_LIBRARY_NOT_FOUND)
        N(NVML_ERROR_FUNCTION_NOT_FOUND) N(NVML_ERROR_GPU_IS_LOST) N(NVML_ERROR_MEMORY)
        N(NVML_ERROR_NO_DATA) N(NVML_ERROR_ARGUMENT_VERSION_MISMATCH) N(NVML_ERROR_UNKNOWN)
#undef N
    case NOT_EXPORTED:
        return "<not exported by the library>";
    default:
        return "<unknown code>";
    }
}

#define NV(fn, ...) ((void *)&(fn) == NULL ? (nvmlReturn_t)NOT_EXPORTED : fn(__VA_ARGS__))
#define CHECK_NV(want, fn, ...) check_nv_(__LINE__, #fn, #want, (want), NV(fn, __VA_ARGS__))
#define OK_NV(fn, ...) CHECK_NV(NVML_SUCCESS, fn, __VA_ARGS__)
static __attribute__((unused)) int check_nv_(int line, const char *fn, const char *wname, nvmlReturn_t want,
                     nvmlReturn_t got) {
    if (got == want) {
        if (want == NVML_SUCCESS)
            pass_("%s", fn);
        else
            pass_("%s -> %s", fn, wname);
        return 1;
    }
    fail_(line, "%s: returned %s (%u), expected %s", fn, nvml_name(got), (unsigned)got, wname);
    return 0;
}
#endif /* CHECK_NVML */

#endif
