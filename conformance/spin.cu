// The conformance programs' kernel for a real GPU: `spin(u64 ns)` keeps
// each block busy for `ns` nanoseconds (the sim's `kernel spin` does the
// same without a GPU). Build: nvcc -cubin -o spin.cubin conformance/spin.cu
// and run the programs with VGPU_CONF_CUBIN=spin.cubin.
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
