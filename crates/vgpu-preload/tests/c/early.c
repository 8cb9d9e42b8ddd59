/* When the front object loads the interposer proper: not for a lookup of
 * any other name, but at the first lookup of a driver name (before the
 * first call, so that the load is not part of cuInit's latency). */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int passed, failed;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    if (ok)
        passed++;
    else
        failed++;
}

static int core_mapped(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "libvgpu_core.so"))
            found = 1;
    if (f)
        fclose(f);
    return found;
}

int main(void) {
    check(!core_mapped(), "the core is not loaded at start");
    check(dlsym(RTLD_DEFAULT, "strlen") != NULL, "dlsym(strlen)");
    check(!core_mapped(), "a lookup of a non-driver name leaves it out");
    void *init = dlsym(RTLD_DEFAULT, "cuInit");
    check(init != NULL, "dlsym(cuInit)");
    check(core_mapped(), "the first lookup of a driver name loads it");
    CUresult (*call)(unsigned) = (CUresult(*)(unsigned))init;
    check(call && call(0) == CUDA_SUCCESS, "cuInit through the pointer");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
