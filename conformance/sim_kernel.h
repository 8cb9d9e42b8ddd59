/* How a conformance program gets a "kernel": `spin(u64 ns)`, which keeps
 * each block busy for `ns` nanoseconds.
 *
 * - On the simulated driver (VGPU_SIM_DIR set) the module image is the
 *   sim's text format naming a simulated kernel (docs/sim.md).
 * - On a real driver the image is the PTX below (JIT-compiled by the
 *   driver; the same kernel as spin.cu), so the programs need no nvcc.
 * - VGPU_CONF_CUBIN names a cubin/PTX file to use instead, holding a kernel
 *   VGPU_CONF_KERNEL (default "spin") with the same signature.
 * This is the one place that knows image formats; the programs stay plain
 * CUDA.
 */
#ifndef VGPU_CONFORMANCE_SIM_KERNEL_H
#define VGPU_CONFORMANCE_SIM_KERNEL_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

/* The sim's module image: text naming the kernels it provides. */
static const char SIM_MODULE_IMAGE[] = "vgpu-sim-module v1\nkernel spin\n";

/* spin.cu as PTX: spin until %globaltimer has advanced by the argument. */
static const char SPIN_PTX[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u64 spin_ns)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b64 %rd<6>;\n"
    "  ld.param.u64 %rd1, [spin_ns];\n"
    "  mov.u64 %rd2, %globaltimer;\n"
    "SPIN_LOOP:\n"
    "  mov.u64 %rd3, %globaltimer;\n"
    "  sub.s64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p1, %rd4, %rd1;\n"
    "  @%p1 bra SPIN_LOOP;\n"
    "  ret;\n"
    "}\n";

static __attribute__((unused)) const char *sim_kernel_name(void) {
    const char *n = getenv("VGPU_CONF_KERNEL");
    return n && *n ? n : "spin";
}

/* The image to pass to cuModuleLoadData (see above). The caller never
 * frees it. */
static __attribute__((unused)) const void *sim_module_image(void) {
    const char *path = getenv("VGPU_CONF_CUBIN");
    if (!path || !*path) {
        const char *sim = getenv("VGPU_SIM_DIR");
        return sim && *sim ? (const void *)SIM_MODULE_IMAGE : (const void *)SPIN_PTX;
    }
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
