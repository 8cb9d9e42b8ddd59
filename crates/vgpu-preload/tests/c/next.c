/* A second interposer, preloaded after libvgpu.so, that wraps an entry
 * point libvgpu.so does not hook and finds the real one with
 * dlsym(RTLD_NEXT, ...), as profilers and other shims do. If RTLD_NEXT were
 * answered relative to libvgpu.so, the lookup would return this very
 * function and the wrapper would recurse. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

static int depth;

CUresult cuDeviceGetCount(int *count) {
    static CUresult (*next)(int *);
    if (!next)
        *(void **)&next = dlsym(RTLD_NEXT, "cuDeviceGetCount");
    if (!next || (void *)next == (void *)cuDeviceGetCount || depth > 0) {
        fprintf(stderr, "next.c: RTLD_NEXT gave %s\n", next ? "this wrapper itself" : "nothing");
        return CUDA_ERROR_UNKNOWN;
    }
    depth++;
    CUresult r = next(count);
    depth--;
    return r;
}
