/* How a conformance program gets a "kernel" on the simulated driver.
 *
 * The sim has no real GPU code: a module image names simulated kernels
 * whose per-block time the caller chooses. This is the one place that
 * knows the sim's module format, so that the programs stay plain CUDA.
 * On a real driver, VGPU_CONF_CUBIN can name a cubin/PTX file holding a
 * kernel `VGPU_CONF_KERNEL` (default "spin") taking one u64 argument, the
 * per-block time in nanoseconds.
 */
#ifndef VGPU_CONFORMANCE_SIM_KERNEL_H
#define VGPU_CONFORMANCE_SIM_KERNEL_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

/* The sim's module image: text naming the kernels it provides. */
static const char SIM_MODULE_IMAGE[] = "vgpu-sim-module v1\nkernel spin\n";

static const char *sim_kernel_name(void) {
    const char *n = getenv("VGPU_CONF_KERNEL");
    return n && *n ? n : "spin";
}

/* The image to pass to cuModuleLoadData (read from VGPU_CONF_CUBIN when
 * set; the sim's text image otherwise). The caller never frees it. */
static const void *sim_module_image(void) {
    const char *path = getenv("VGPU_CONF_CUBIN");
    if (!path || !*path)
        return SIM_MODULE_IMAGE;
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        perror(path);
        exit(2);
    }
    buf[n] = 0;
    fclose(f);
    return buf;
}

#endif
