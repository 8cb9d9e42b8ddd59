/* Every way a program can ask the loader for a lookup function ends at
 * libvgpu.so's hooks: glibc's own dlsym fetched with dlvsym (RTLD_DEFAULT
 * or libc's handle), dlsym of "dlsym" from libc's handle, and dlvsym of a
 * driver name. Prints how many 256 MiB allocations each route got. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

/* glibc's first version of dlsym on this architecture (2.34 moved it). */
#if defined(__aarch64__)
#define BASE_VERSION "GLIBC_2.17"
#else
#define BASE_VERSION "GLIBC_2.2.5"
#endif

typedef void *(*dlsym_t)(void *, const char *);
typedef void *(*dlvsym_t)(void *, const char *, const char *);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);

static int fill(const char *what, alloc_t alloc) {
    CUdeviceptr p[16];
    int n = 0;
    if (!alloc) {
        printf("%s=missing\n", what);
        return -1;
    }
    while (n < 8 && alloc(&p[n], 256u << 20) == CUDA_SUCCESS)
        n++;
    for (int i = 0; i < n; i++)
        cuMemFree_v2(p[i]);
    printf("%s=%d\n", what, n);
    return n;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUdevice d;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&ctx, d) || cuCtxSetCurrent(ctx)) {
        printf("init failed\n");
        return 1;
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    dlsym_t v234 = (dlsym_t)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
    dlsym_t vbase = (dlsym_t)dlvsym(RTLD_DEFAULT, "dlsym", BASE_VERSION);
    dlsym_t vlibc = (dlsym_t)dlvsym(libc, "dlsym", "GLIBC_2.34");
    dlsym_t slibc = (dlsym_t)dlsym(libc, "dlsym");
    dlvsym_t dvlibc = (dlvsym_t)dlsym(libc, "dlvsym");
    printf("dlsym_is_ours=%d\n", v234 == (dlsym_t)dlsym && vbase == (dlsym_t)dlsym &&
                                     vlibc == (dlsym_t)dlsym && slibc == (dlsym_t)dlsym);
    fill("dlvsym_default_2_34", v234 ? (alloc_t)v234(cuda, "cuMemAlloc_v2") : NULL);
    fill("dlvsym_default_base", vbase ? (alloc_t)vbase(cuda, "cuMemAlloc_v2") : NULL);
    fill("dlvsym_libc", vlibc ? (alloc_t)vlibc(cuda, "cuMemAlloc_v2") : NULL);
    fill("dlsym_libc", slibc ? (alloc_t)slibc(cuda, "cuMemAlloc_v2") : NULL);
    fill("dlvsym_libc_dlvsym",
         dvlibc ? (alloc_t)((dlsym_t)dvlibc(RTLD_DEFAULT, "dlsym", "GLIBC_2.34"))(cuda, "cuMemAlloc_v2") : NULL);
    fill("dlvsym_driver_name", (alloc_t)dlvsym(cuda, "cuMemAlloc_v2", "libcuda.so.1"));
    fill("direct", cuMemAlloc_v2);
    return 0;
}
