/* When the front object loads the interposer proper (libvgpu_core.so):
 * never for a process that does not use the driver, and before the first
 * call for one that does, so that the load is not part of cuInit's
 * latency.
 *   built with -lcuda (it calls cuInit directly): loaded before main (the
 *     front's constructor saw libcuda.so.1 among the loaded objects);
 *   built with -DEARLY_DLOPEN and without -lcuda: not at start, not for a
 *     lookup of another name, not for the dlopen of the driver; at the
 *     first lookup of a driver name. */
#define _GNU_SOURCE
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

#ifndef EARLY_DLOPEN
int cuInit(unsigned flags);

int main(void) {
    check(core_mapped(), "linked against the driver: the core is loaded before main");
    check(cuInit(0) == 0, "cuInit, called directly");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
#else
int main(void) {
    check(!core_mapped(), "the core is not loaded at start");
    check(dlsym(RTLD_DEFAULT, "strlen") != NULL, "dlsym(strlen)");
    check(!core_mapped(), "a lookup of a non-driver name leaves it out");
    check(dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) != NULL, "dlopen(libcuda.so.1)");
    check(!core_mapped(), "the dlopen of the driver leaves it out");
    void *init = dlsym(RTLD_DEFAULT, "cuInit");
    check(init != NULL, "dlsym(cuInit)");
    check(core_mapped(), "the first lookup of a driver name loads it");
    int (*call)(unsigned) = (int (*)(unsigned))init;
    check(call && call(0) == 0, "cuInit through the pointer");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
#endif
